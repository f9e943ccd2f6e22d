//! `rozd check`: a human-readable summary of the effective configuration.

use super::load::Config;

impl Config {
    /// `[server.tls]` in one line: the certificate's subject and end, and
    /// client authentication.
    fn tls_summary(&self) -> String {
        let Some(tls) = &self.server.tls else {
            return if self.server.allow_plaintext_remote {
                "off (plaintext, allowed on every address)".to_string()
            } else {
                "off (plaintext)".to_string()
            };
        };
        match crate::tls::server::check(tls) {
            Ok(report) => format!(
                "{} ({}, until {}), client certificates: {}",
                tls.cert_file.display(),
                report.subject,
                report.not_after,
                tls.client_auth.as_str()
            ),
            Err(e) => format!("cannot be served: {e}"),
        }
    }

    /// A human-readable summary of the effective configuration (no secrets).
    pub fn summary(&self) -> String {
        let source = &self.source;
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!("config:        {source}"));
        line(format!(
            "host:          {} ({})",
            self.host.id,
            self.host.display_name()
        ));
        line(format!("environment:   {}", self.host.environment_id));
        line(format!("listen:        {}", self.server.listen));
        line(format!(
            "auth:          {}",
            if self.auth_required() {
                let clients = self.auth.clients.len();
                let tokens = self.credential_count().saturating_sub(clients);
                if clients == 0 {
                    format!("{tokens} bearer token(s)")
                } else {
                    format!("{tokens} bearer token(s), {clients} client certificate subject(s)")
                }
            } else {
                "none (loopback only)".to_string()
            }
        ));
        line(format!("tls:           {}", self.tls_summary()));
        let server = &self.server;
        line(format!(
            "connections:   at most {} over TCP, HTTP/1 head within {} s, idle closed after {} s",
            server.max_connections,
            server.header_read_timeout.as_secs(),
            server.idle_timeout.as_secs()
        ));
        line(format!(
            "allowed hosts: {}",
            if server.allowed_hosts.is_empty() {
                "this host's own names and IP addresses".to_string()
            } else {
                format!("this host's own and {}", server.allowed_hosts.join(", "))
            }
        ));
        line(format!(
            "control:       {}",
            server.control_socket.path(&self.store).map_or_else(
                || "no control socket".to_string(),
                |p| p.display().to_string()
            )
        ));
        line(format!(
            "log:           {} ({:?})",
            self.log.level, self.log.format
        ));
        line(format!(
            "store:         {}",
            self.store.resolved_path().display()
        ));
        line(format!("model:         {}", self.model.default));
        line(format!(
            "manual:        {}",
            match &self.manual {
                Some(m) => format!("{} ({} bytes)", m.path.display(), m.text.len()),
                None => "none (sessions are told the embodiment only; see [agent] manual_file)"
                    .to_string(),
            }
        ));
        let t = &self.tasks;
        line(format!(
            "tasks:         up to {} at once, {} worker(s) each, timeout {} s (max {} s), {}, model {}",
            t.max_concurrent,
            t.max_workers,
            t.default_timeout_secs,
            t.max_timeout_secs,
            t.ai_mode.as_str(),
            t.model.as_deref().unwrap_or(&self.model.default)
        ));
        for e in &self.model.endpoints {
            let r = self.model.resolve(e);
            let key = match (&r.api_key_file, &r.api_key_env) {
                (Some(f), _) => format!("key from {}", f.display()),
                (None, Some(var)) => format!("key from ${var}"),
                (None, None) => "no key".to_string(),
            };
            line(format!(
                "  endpoint:    {} = {} {} at {} ({key})",
                r.name,
                r.provider.as_str(),
                r.model,
                r.base_url
            ));
        }
        let l = self.ooda.loop_config();
        line(format!(
            "ooda tick:     {} Hz on {} (Observation at {} Hz){}{}{}",
            l.tick_hz,
            if l.timer == crate::ooda::timer::Timer::Thread {
                "its own thread"
            } else {
                "the runtime's clock"
            },
            l.publish_hz,
            l.realtime
                .priority
                .map_or(String::new(), |p| format!(", SCHED_FIFO {p}")),
            l.realtime
                .cpus
                .as_ref()
                .map_or(String::new(), |c| format!(", CPUs {c:?}")),
            if l.realtime.lock_memory {
                ", memory locked"
            } else {
                ""
            },
        ));
        line(format!(
            "permissions:   {} rule(s); approvals by {}",
            self.permissions.len(),
            if self.approvals.require_other_credential {
                "another credential than the caller's"
            } else {
                "any credential with operate"
            }
        ));
        line(format!(
            "stop inputs:   {}",
            crate::safety::inputs::describe(&self.safety)
        ));
        line(format!(
            "fleet:         {}",
            match &self.fleet {
                Some(f) => format!(
                    // A validated fleet always has its token.
                    "{} (prefix {}, heartbeat {}s, advertise {}, token set)",
                    f.broker.url,
                    f.topic_prefix,
                    f.heartbeat_secs(),
                    f.advertise.as_deref().unwrap_or("http://<listen address>"),
                ),
                None => "none (this host alone)".to_string(),
            }
        ));
        line(format!("mcp:           {}", self.mcp.describe()));
        line(format!("foxglove:      {}", self.foxglove.describe()));
        line(format!(
            "record:        {}",
            self.record.as_ref().map_or_else(
                || "off".to_string(),
                |r| r.describe(&self.store.resolved_path())
            )
        ));
        let hardware = &self.hardware;
        let sensors: Vec<&str> = hardware.sensors.iter().map(|s| s.name.as_str()).collect();
        let actuators: Vec<&str> = hardware.actuators.iter().map(|a| a.name.as_str()).collect();
        line(format!(
            "sensors:       {} [{}]",
            sensors.len(),
            sensors.join(", ")
        ));
        line(format!(
            "actuators:     {} [{}]",
            actuators.len(),
            actuators.join(", ")
        ));
        if let Some(w) = &self.hardware.sim_world {
            line(format!(
                "sim world:     {} m x {} m, {} obstacle(s), rover at ({}, {}), seed {}",
                w.width,
                w.depth,
                w.obstacles.len(),
                w.start.x,
                w.start.y,
                w.seed
            ));
        }
        out
    }
}
