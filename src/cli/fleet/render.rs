//! The fleet report as text.

use std::fmt::{self, Display, Formatter};

use super::figures::{FleetReport, Group, Period};

/// `12.3`, `0.046`: GPU-hours with three significant digits below 100.
fn hours(h: f64) -> String {
    if h.abs() >= 100.0 {
        format!("{h:.0}")
    } else if h.abs() >= 1.0 {
        format!("{h:.1}")
    } else {
        format!("{h:.3}")
    }
}

fn share(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.0} %", 100.0 * part / whole)
    } else {
        "-".to_owned()
    }
}

/// `namespace=team-a`, `(no owner)` when every label is empty.
fn group_name(g: &Group) -> String {
    let set: Vec<String> = g.labels.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}={v}")).collect();
    if set.is_empty() {
        "(no owner known)".to_owned()
    } else {
        set.join(" ")
    }
}

fn period_lines(f: &mut Formatter<'_>, p: &Period, title: &str) -> fmt::Result {
    let t = &p.totals;
    if p.gpus == 0 {
        return writeln!(f, "{title}: no gpumon accounts");
    }
    writeln!(
        f,
        "{title}: {} GPUs on {} hosts{}",
        p.gpus,
        p.hosts,
        if p.simulated { " (includes SIMULATED or replayed data: backend mock/replay)" } else { "" }
    )?;
    writeln!(f, "  GPU-hours observed               {:>10}", hours(t.observed_gpu_hours))?;
    writeln!(
        f,
        "  GPU-hours allocated              {:>10}  ({} of observed)",
        hours(t.allocated_gpu_hours),
        share(t.allocated_gpu_hours, t.observed_gpu_hours)
    )?;
    writeln!(
        f,
        "  GPU-hours idle while allocated   {:>10}  ({} of allocated)",
        hours(t.idle_allocated_gpu_hours),
        share(t.idle_allocated_gpu_hours, t.allocated_gpu_hours)
    )?;
    writeln!(f, "  energy                           {:>10} kWh", hours(t.energy_kwh))?;
    let mut lost: Vec<_> = t.lost_gpu_hours.iter().filter(|(_, h)| **h > 0.0).collect();
    lost.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    if lost.is_empty() {
        writeln!(f, "  GPU-hours lost per cause: none found")?;
    } else {
        writeln!(f, "  GPU-hours lost per cause (causes can overlap):")?;
        for (cause, h) in lost {
            writeln!(f, "    {cause:<28} {:>10}", hours(*h))?;
        }
    }
    Ok(())
}

impl Display for FleetReport {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let p = &self.period;
        let days = (p.until - p.from) / 86_400.0;
        let length = if days >= 1.0 { format!("{days:.0} d") } else { format!("{:.0} h", days * 24.0) };
        writeln!(f, "Fleet GPU-hours over the last {length}, from {}", self.source)?;
        period_lines(f, p, "Now")?;
        if let Some(prev) = &self.previous {
            period_lines(f, prev, "Compared period")?;
        }
        writeln!(
            f,
            "\nTop {} of {} groups by {} (idle GPU-hours while allocated):",
            self.groups.len(),
            self.group_count,
            serde_json::to_value(self.by).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
        )?;
        for g in &self.groups {
            let before =
                g.previous_idle_allocated_gpu_hours.map(|b| format!(", before {}", hours(b))).unwrap_or_default();
            writeln!(
                f,
                "  {:<40} idle {:>8} of {:>8} allocated ({}){before}",
                group_name(g),
                hours(g.idle_allocated_gpu_hours),
                hours(g.allocated_gpu_hours),
                share(g.idle_allocated_gpu_hours, g.allocated_gpu_hours)
            )?;
            match (&g.main_cause, &g.advice) {
                (Some(cause), advice) => {
                    writeln!(f, "      main cause: {cause} ({} GPU-hours lost)", hours(g.main_cause_gpu_hours))?;
                    if let Some(advice) = advice {
                        writeln!(f, "      advice: {advice}")?;
                    }
                }
                (None, _) => writeln!(f, "      no cause found")?,
            }
        }
        Ok(())
    }
}
