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

/// The first clause of a limitation's reason or remedy: the text up to the first `: `, ` — `,
/// `; ` or `, and ` outside parentheses, so that its figures ("(measured here: 500ms)", "the
/// window holds 3 tick(s) (window 300ms / interval 100ms)") stay and the explanation goes to
/// `--verbose` and the JSON.
pub(super) fn first_clause(text: &str) -> &str {
    let mut depth = 0usize;
    for (at, c) in text.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => {
                let rest = &text[at..];
                if [": ", " — ", "; ", ", and "].iter().any(|m| rest.starts_with(m)) {
                    return &text[..at];
                }
            }
            _ => {}
        }
    }
    text
}

/// The main-cause line when no finding was raised: a run shorter than the diagnosis window
/// never filled one, and says so rather than "none".
fn write_no_main_cause(f: &mut fmt::Formatter<'_>, r: &Report) -> fmt::Result {
    match r.overview.diagnosis_window_seconds {
        Some(window) if r.wall_seconds < window => writeln!(
            f,
            "  main cause            not diagnosed: the run ({:.1} s) was shorter than the diagnosis window ({window:.1} s); \
             a finding is raised only once a window fills (--diagnose-window)",
            r.wall_seconds
        ),
        _ => writeln!(f, "  main cause            none: no finding was raised on any GPU"),
    }
}

pub(super) fn write_overview(f: &mut fmt::Formatter<'_>, r: &Report, verbose: bool) -> fmt::Result {
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
        None => write_no_main_cause(f, r)?,
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
            if verbose {
                writeln!(f, "    [{}] {l}", l.severity)?;
            } else {
                let rules: Vec<&str> = l.rules.iter().map(|k| k.name()).collect();
                let (reason, remedy) = (first_clause(&l.reason), first_clause(&l.remedy));
                writeln!(f, "    [{}] {}: {reason}; {remedy}", l.severity, rules.join(", "))?;
            }
        }
        if !verbose {
            writeln!(f, "    (each in full: --verbose, or the JSON report)")?;
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

/// The report in full ([`Report::verbose`]): each limitation with its whole reason and remedy.
#[derive(Clone, Copy, Debug)]
pub struct VerboseReport<'a>(&'a Report);

impl Report {
    /// The human summary with every detail: [`Overview::limitations`](super::Overview::limitations)
    /// each with its whole reason and remedy, where `Display` gives one line each (their first
    /// clause, with its figures).
    pub fn verbose(&self) -> VerboseReport<'_> {
        VerboseReport(self)
    }

    /// Whether the run was shorter than the diagnosis window (when the report was told the
    /// settings): no finding could fill a window, so "no main cause" means "not diagnosed".
    pub fn shorter_than_window(&self) -> bool {
        self.overview.diagnosis_window_seconds.is_some_and(|w| self.wall_seconds < w)
    }
}

impl fmt::Display for VerboseReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_report(f, self.0, true)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_report(f, self, false)
    }
}

fn write_report(f: &mut fmt::Formatter<'_>, report: &Report, verbose: bool) -> fmt::Result {
    let simulated = backend_note(&report.backend);
    writeln!(
        f,
        "gpumon run report: host {}{simulated}, {} tick(s) over {:.1} s, interval {} s",
        report.hostname, report.ticks, report.wall_seconds, report.interval_seconds
    )?;
    if report.ticks == 0 {
        // Nothing reached the report: every sample failed (no NVML, with a sink that must
        // not get simulated data), or the run ended before the first. Zeros would read as
        // a run that idled no GPU; say what happened instead.
        return writeln!(
            f,
            "  no sample was taken during the run: the GPU backend was unavailable throughout, or the run \
                 ended before the first sample (the log says which); nothing is reported, steps included"
        );
    }
    write_overview(f, report, verbose)?;
    if let Some(steps) = &report.steps {
        write_steps(f, steps)?;
    }
    for g in &report.gpus {
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
    if !report.host_findings.is_empty() {
        writeln!(f, "host findings:")?;
        for r in &report.host_findings {
            write_finding(f, r)?;
        }
    }
    Ok(())
}
