//! Issue 36, the robot's manual: `GET /v1/embodiment` (JSON and Markdown)
//! and `rozd manual` say what a session starting now is told.

use crate::common::{TestDaemon, rozd_cli};

const HARDWARE: &str = r#"
[[sensors]]
name = "temp"
source = "sim"
unit = "degC"
warn_max = 70.0
critical_max = 85.0

[[actuators]]
name = "arm"
kind = "sim"
unit = "rad"
description = "arm angle"
min = -1.0
max = 1.0
safe_value = 0.0
hold_ms = 5000

[[permissions]]
tool_pattern = "arm"
policy = "block"
"#;

async fn daemon(dir: &std::path::Path) -> TestDaemon {
    let manual = dir.join("AGENTS.md");
    std::fs::write(&manual, "Keep the arm down while people are near.\n").unwrap();
    TestDaemon::start(&format!(
        "[agent]\nmanual_file = {:?}\n{HARDWARE}",
        manual.display().to_string()
    ))
    .await
}

#[tokio::test]
async fn get_embodiment_answers_json_and_markdown_and_refuses_an_unknown_format() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path()).await;
    let addr = daemon.addr.to_string();
    let (status, body) = crate::common::rest_get(&daemon, "/v1/embodiment").await;
    assert_eq!(status, 200, "{body}");
    let current = daemon.host.briefing();
    assert_eq!(body["version"], current.version.as_str());
    let arm = &body["embodiment"]["actuators"][0];
    assert_eq!(
        (
            arm["name"].as_str(),
            arm["min"].as_f64(),
            arm["max"].as_f64(),
            arm["safe_value"].as_f64(),
            arm["hold_ms"].as_u64(),
            arm["policy"].as_str()
        ),
        (
            Some("arm"),
            Some(-1.0),
            Some(1.0),
            Some(0.0),
            Some(5000),
            Some("block")
        ),
        "{arm}"
    );
    assert_eq!(body["embodiment"]["sensors"][0]["critical_max"], 85.0);
    assert_eq!(
        body["manual"]["text"],
        "Keep the arm down while people are near.\n"
    );
    let briefing = body["briefing"].as_str().unwrap();
    assert_eq!(briefing, current.text());
    let markdown = body["embodiment"]["markdown"].as_str().unwrap();
    assert!(briefing.starts_with(markdown));
    assert!(markdown.contains("`arm` (rad): arm angle; range -1 to 1 rad; safe value 0 rad"));
    assert!(markdown.contains("- Blocked: `arm`."), "{markdown}");

    let reply = rozd::cli::client::get(&addr, "/v1/embodiment?format=markdown", None)
        .await
        .unwrap();
    assert_eq!(reply.status.as_u16(), 200);
    assert_eq!(reply.body, markdown);
    let reply = rozd::cli::client::get(&addr, "/v1/embodiment?format=xml", None)
        .await
        .unwrap();
    assert_eq!(reply.status.as_u16(), 400);
    let error: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(error["error"]["code"], "invalid_argument", "{error}");

    // `rozd manual` prints the same text and its version.
    let (code, stdout, stderr) = rozd_cli(&["manual", "--addr", &addr]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with(briefing.trim_end()), "{stdout}");
    assert!(
        stdout.contains(&format!("-- version {}; manual ", current.version)),
        "{stdout}"
    );
    let (code, stdout, _) = rozd_cli(&["manual", "--addr", &addr, "--json"]).await;
    assert_eq!(code, Some(0));
    let raw: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(raw["version"], current.version.as_str());
    daemon.shutdown().await;
}

/// The reload SIGHUP runs: a manual that cannot be read at a reload (here a
/// directory where the file was) keeps the previous one for new sessions;
/// a readable one replaces it.
#[tokio::test]
async fn a_manual_that_cannot_be_read_at_a_reload_keeps_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path()).await;
    let manual = dir.path().join("AGENTS.md");
    let before = daemon.host.briefing();
    std::fs::remove_file(&manual).unwrap();
    std::fs::create_dir(&manual).unwrap();
    daemon.host.reload_manual().await;
    let after = daemon.host.briefing();
    assert_eq!(after.version, before.version);
    assert!(
        after
            .text()
            .contains("Keep the arm down while people are near.")
    );

    std::fs::remove_dir(&manual).unwrap();
    std::fs::write(&manual, "The cell is closed on Sundays.\n").unwrap();
    daemon.host.reload_manual().await;
    let reloaded = daemon.host.briefing();
    assert_ne!(reloaded.version, before.version);
    assert!(reloaded.text().contains("The cell is closed on Sundays."));
    assert!(!reloaded.text().contains("Keep the arm down"));
    // The embodiment is the configuration's: a reload leaves it as it was.
    assert_eq!(reloaded.embodiment, before.embodiment);
    let (_, body) = crate::common::rest_get(&daemon, "/v1/embodiment").await;
    assert_eq!(body["version"], reloaded.version.as_str());
    daemon.shutdown().await;
}
