//! The human summary: `Display` for [`Report`](super::Report).

use std::fmt;

use super::model::{EnergySource, FindingReport, Report, StepsReport};

pub(super) fn gib(bytes: u64) -> f64 {
    bytes as f64 / 1_073_741_824.0
}

/// `1.234 GPU-h (4442.4 GPU-s)`.
pub(super) fn gpu_time(seconds: f64) -> String {
    format!("{:.3} GPU-h ({seconds:.1} GPU-s)", seconds / 3600.0)
}

pub(super) fn percent_of(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole * 100.0
    } else {
        0.0
    }
}

pub(super) fn write_overview(f: &mut fmt::Formatter<'_>, r: &Report) -> fmt::Result {
    let o = &r.overview;
    writeln!(f, "overview")?;
    writeln!(
        f,
        "  GPUs                  {}, wall time {:.1} s, {} observed",
        o.gpus,
        r.wall_seconds,
        gpu_time(o.gpu_seconds)
    )?;
    writeln!(
        f,
        "  idle while allocated  {} of {:.1} GPU-s allocated ({:.1} %)",
        gpu_time(o.idle_allocated_seconds),
        o.allocated_seconds,
        percent_of(o.idle_allocated_seconds, o.allocated_seconds)
    )?;
    match &o.main_cause {
        Some(c) => writeln!(
            f,
            "  main cause            {} on {} GPU(s): {} lost",
            c.kind,
            c.gpus,
            gpu_time(c.lost_gpu_seconds)
        )?,
        None => writeln!(f, "  main cause            none: no finding was raised on any GPU")?,
    }
    if !o.causes.is_empty() {
        writeln!(f, "  time lost per cause   (GPU-time; causes can hold at once, so they overlap)")?;
        for c in &o.causes {
            writeln!(
                f,
                "    {:<22} {:>8.1} GPU-s lost, held {:.1} GPU-s on {} GPU(s), raised {} time(s)",
                c.kind.name(),
                c.lost_gpu_seconds,
                c.active_gpu_seconds,
                c.gpus,
                c.raised
            )?;
        }
    }
    match o.driver_sample_period_seconds {
        Some(p) => writeln!(
            f,
            "  driver sampling       utilisation every {p:.3} s ({:.1} sample(s) per interval)",
            r.interval_seconds / p
        )?,
        None => writeln!(f, "  driver sampling       unknown (no high-resolution utilisation samples)")?,
    }
    if o.limitations.is_empty() {
        writeln!(f, "  limitations           none")?;
    } else {
        writeln!(f, "  limitations:")?;
        for l in &o.limitations {
            writeln!(f, "    [{}] {l}", l.severity)?;
        }
    }
    Ok(())
}

/// `median 1.203 s, p95 1.290 s, mean 1.210 s`.
pub(super) fn write_step_times(
    f: &mut fmt::Formatter<'_>,
    median: Option<f64>,
    p95: Option<f64>,
    mean: Option<f64>,
    energy: Option<f64>,
) -> fmt::Result {
    if let (Some(median), Some(p95), Some(mean)) = (median, p95, mean) {
        write!(f, "step time median {median:.3} s, p95 {p95:.3} s, mean {mean:.3} s")?;
    }
    if let Some(e) = energy {
        write!(f, "; {e:.1} J per step")?;
    }
    writeln!(f)
}

pub(super) fn write_steps(f: &mut fmt::Formatter<'_>, s: &StepsReport) -> fmt::Result {
    write!(f, "steps                   {} step(s)", s.steps)?;
    if s.steps > 0 {
        f.write_str(", ")?;
    }
    write_step_times(
        f,
        s.duration_median_seconds,
        s.duration_p95_seconds,
        s.duration_mean_seconds,
        s.energy_per_step_joules,
    )?;
    for r in &s.runs {
        let mut name = String::new();
        crate::stages::text::push_one_line(&mut name, &r.job);
        if let Some(rank) = r.rank {
            name.push_str(&format!(" rank {rank}"));
        }
        write!(f, "  {name:<21} {} step(s)", r.steps)?;
        if let (Some(a), Some(b)) = (r.first_step, r.last_step) {
            write!(f, " ({a}–{b})")?;
        }
        f.write_str(", ")?;
        write_step_times(f, r.duration_median_seconds, r.duration_p95_seconds, r.duration_mean_seconds, None)?;
    }
    if let Some(rejected) = s.marks_rejected.filter(|r| r.total() > 0) {
        write_marks_rejected(f, &rejected)?;
    }
    Ok(())
}

/// `  marks dropped         10 refused, 1 malformed` and what a refused mark usually is.
pub(super) fn write_marks_rejected(f: &mut fmt::Formatter<'_>, rejected: &crate::steps::StepRejections) -> fmt::Result {
    use crate::steps::Rejection;
    let mut parts = Vec::new();
    for reason in Rejection::ALL {
        let n = rejected.get(reason);
        if n > 0 {
            parts.push(format!("{n} {}", reason.name()));
        }
    }
    writeln!(f, "  marks dropped         {} (not in the step figures)", parts.join(", "))?;
    if rejected.refused > 0 {
        writeln!(
            f,
            "    refused: a step number not above the run's last (numbering restarted, e.g. each epoch: mark a step count that only grows, or a new job name per epoch), a bad job name, or too many runs"
        )?;
    }
    Ok(())
}

pub(super) fn write_finding(f: &mut fmt::Formatter<'_>, r: &FindingReport) -> fmt::Result {
    write!(f, "    {} ({}) held {:.1} s, {:.1} GPU-s lost", r.kind, r.severity, r.held_seconds, r.lost_gpu_seconds)?;
    if r.active_at_exit {
        f.write_str(", still active at exit")?;
    }
    writeln!(f)?;
    if !r.evidence.is_empty() {
        writeln!(f, "      evidence: {}", r.evidence)?;
    }
    writeln!(f, "      advice: {}", r.advice)
}

/// What a report's or comparison's header says of data that was not read from a GPU just now:
/// simulated (the mock) or played back from a recorded trace.
pub(crate) fn backend_note(backend: &str) -> &'static str {
    match backend {
        "mock" => " (MOCK backend: simulated GPUs)",
        crate::REPLAY_BACKEND => " (REPLAY of a recorded trace, not live GPUs)",
        _ => "",
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let simulated = backend_note(&self.backend);
        writeln!(
            f,
            "gpumon run report: host {}{simulated}, {} tick(s) over {:.1} s, interval {} s",
            self.hostname, self.ticks, self.wall_seconds, self.interval_seconds
        )?;
        if self.ticks == 0 {
            // Nothing reached the report: every sample failed (no NVML, with a sink that must
            // not get simulated data), or the run ended before the first. Zeros would read as
            // a run that idled no GPU; say what happened instead.
            return writeln!(
                f,
                "  no sample was taken during the run: the GPU backend was unavailable throughout, or the run \
                 ended before the first sample (the log says which); nothing is reported, steps included"
            );
        }
        write_overview(f, self)?;
        if let Some(steps) = &self.steps {
            write_steps(f, steps)?;
        }
        for g in &self.gpus {
            writeln!(f, "GPU {} {} ({}), {} sample(s)", g.index, g.name, g.uuid, g.samples)?;
            match (g.utilization_mean, g.utilization_p5, g.utilization_p95) {
                (Some(m), Some(p5), Some(p95)) => writeln!(
                    f,
                    "  utilisation   mean {:.1} %, p5 {:.1} %, p95 {:.1} %",
                    m * 100.0,
                    p5 * 100.0,
                    p95 * 100.0
                )?,
                _ => writeln!(f, "  utilisation   not reported")?,
            }
            match (g.memory_peak_bytes, g.memory_total_bytes) {
                (Some(p), Some(t)) => writeln!(f, "  memory        peak {:.1} GiB of {:.1} GiB", gib(p), gib(t))?,
                (Some(p), None) => writeln!(f, "  memory        peak {:.1} GiB", gib(p))?,
                _ => writeln!(f, "  memory        not reported")?,
            }
            match g.power_mean_watts {
                Some(p) => write!(f, "  power         mean {p:.0} W")?,
                None => write!(f, "  power         not reported")?,
            }
            if let (Some(e), Some(src)) = (g.energy_joules, g.energy_source) {
                let how = match src {
                    EnergySource::Counter => "energy counter",
                    EnergySource::IntegratedPower => "power × interval",
                };
                write!(f, "; energy {:.1} kJ ({:.3} kWh, from {how})", e / 1e3, e / 3.6e6)?;
            }
            writeln!(f)?;
            writeln!(
                f,
                "  idle while allocated  {:.1} s of {:.1} s allocated ({:.1} %; {} whole idle tick(s))",
                g.idle_allocated_seconds,
                g.allocated_seconds,
                percent_of(g.idle_allocated_seconds, g.allocated_seconds),
                g.idle_allocated_ticks
            )?;
            if g.findings.is_empty() {
                writeln!(f, "  findings      none")?;
            } else {
                writeln!(f, "  findings:")?;
                for r in &g.findings {
                    write_finding(f, r)?;
                }
            }
        }
        if !self.host_findings.is_empty() {
            writeln!(f, "host findings:")?;
            for r in &self.host_findings {
                write_finding(f, r)?;
            }
        }
        Ok(())
    }
}
