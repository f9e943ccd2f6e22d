//! Real values of the host rozd runs on (sysinfo): CPU load, memory, disk,
//! CPU temperature, uptime.

use std::sync::Arc;
use std::time::Duration;

use sysinfo::{Components, Disks, System};
use tokio_util::sync::CancellationToken;

use super::config::SystemMetric;
use super::{Health, Readings};

/// One reading of a metric; `Err` says why it is not available here.
pub(crate) fn read_metric(metric: SystemMetric, system: &mut System) -> Result<f64, String> {
    match metric {
        SystemMetric::CpuLoad => {
            let load = System::load_average().map_err(|e| e.to_string())?;
            let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
            Ok(load.one / cpus as f64)
        }
        SystemMetric::CpuUsage => {
            system.refresh_cpu_usage();
            Ok(f64::from(system.global_cpu_usage()))
        }
        SystemMetric::MemoryUsedPercent => {
            system.refresh_memory();
            let total = system.total_memory();
            if total == 0 {
                return Err("total memory is unknown".into());
            }
            Ok(100.0 * system.used_memory() as f64 / total as f64)
        }
        SystemMetric::MemoryAvailableMb => {
            system.refresh_memory();
            Ok(system.available_memory() as f64 / (1024.0 * 1024.0))
        }
        SystemMetric::DiskUsedPercent => {
            let disks = Disks::new_with_refreshed_list().map_err(|e| e.to_string())?;
            let root = disks
                .iter()
                .filter(|d| std::path::Path::new("/var/lib").starts_with(d.mount_point()))
                .max_by_key(|d| d.mount_point().as_os_str().len())
                .ok_or("no disk holds /var/lib")?;
            let total = root.total_space();
            if total == 0 {
                return Err("disk size is unknown".into());
            }
            Ok(100.0 * (total - root.available_space().min(total)) as f64 / total as f64)
        }
        SystemMetric::CpuTemperature => {
            let components = Components::new_with_refreshed_list().map_err(|e| e.to_string())?;
            components
                .iter()
                .filter(|c| {
                    let l = c.label().to_ascii_lowercase();
                    l.contains("cpu")
                        || l.contains("package")
                        || l.contains("soc")
                        || l.contains("core")
                })
                .chain(components.iter())
                .find_map(|c| c.temperature().filter(|t| t.is_finite()).map(f64::from))
                .ok_or_else(|| "no temperature sensor on this machine".to_string())
        }
        SystemMetric::UptimeSecs => System::uptime()
            .map(|s| s as f64)
            .map_err(|e| e.to_string()),
    }
}

/// Polls one metric for one sensor until shutdown.
pub(crate) async fn run_sensor(
    name: String,
    metric: SystemMetric,
    every: Duration,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
) {
    let mut system = match System::new() {
        Ok(s) => s,
        Err(e) => {
            readings.source_health("system", Health::Error(e.to_string()));
            return;
        }
    };
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match read_metric(metric, &mut system) {
            Ok(value) if value.is_finite() => {
                readings.record(&name, value);
                last_error = None;
            }
            Ok(value) => readings.rejected("system", &format!("{name}: non-finite value {value}")),
            Err(e) => {
                if last_error.as_deref() != Some(e.as_str()) {
                    readings.rejected("system", &format!("{name}: {e}"));
                    last_error = Some(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_real_values_of_this_machine() {
        let mut system = System::new().unwrap();
        let mem = read_metric(SystemMetric::MemoryUsedPercent, &mut system).unwrap();
        assert!(mem > 0.0 && mem <= 100.0, "{mem}");
        assert!(read_metric(SystemMetric::UptimeSecs, &mut system).unwrap() > 0.0);
        assert!(read_metric(SystemMetric::CpuLoad, &mut system).unwrap() >= 0.0);
        assert!(read_metric(SystemMetric::MemoryAvailableMb, &mut system).unwrap() > 1.0);
        let disk = read_metric(SystemMetric::DiskUsedPercent, &mut system).unwrap();
        assert!((0.0..=100.0).contains(&disk));
    }
}
