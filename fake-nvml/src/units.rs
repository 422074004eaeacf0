//! The integer units NVML speaks, and the conversions from the data model's base units.
//!
//! The fake encodes with these; [`crate::expected`] decodes with the same arithmetic an NVML
//! client uses, so a test can predict bit-exactly what a client reads.

/// Ratio (0..=1) → whole percent, as NVML's utilisation getters report it.
pub fn percent(ratio: f64) -> u32 {
    clamp_u32((ratio * 100.0).round(), 100)
}

/// Watts → milliwatts.
pub fn milliwatts(watts: f64) -> u32 {
    clamp_u32((watts * 1000.0).round(), u32::MAX)
}

/// Joules → millijoules.
pub fn millijoules(joules: f64) -> u64 {
    let v = (joules * 1000.0).round();
    if v.is_finite() && v > 0.0 {
        v as u64
    } else {
        0
    }
}

/// Hertz → megahertz.
pub fn megahertz(hz: f64) -> u32 {
    clamp_u32((hz / 1e6).round(), u32::MAX)
}

/// °C → whole °C (NVML reports unsigned whole degrees).
pub fn celsius(c: f64) -> u32 {
    clamp_u32(c.round(), u32::MAX)
}

/// Bytes/s → KB/s as `nvmlDeviceGetPcieThroughput` reports it (KB = 1024 bytes here, as the
/// fake and gpumon's NVML backend agree).
pub fn kilobytes_per_second(bytes_per_second: f64) -> u32 {
    clamp_u32((bytes_per_second / 1024.0).round(), u32::MAX)
}

fn clamp_u32(v: f64, max: u32) -> u32 {
    if v.is_finite() && v > 0.0 {
        if v >= f64::from(max) {
            max
        } else {
            v as u32
        }
    } else {
        0
    }
}

/// NVML's `nvmlDeviceArchitecture_t` for an architecture name (`"Hopper"` → 9).
pub fn architecture_code(name: &str) -> Option<u32> {
    ARCHITECTURES.iter().find(|(_, n)| n.eq_ignore_ascii_case(name)).map(|(c, _)| *c)
}

/// The name of an `nvmlDeviceArchitecture_t` value.
pub fn architecture_name(code: u32) -> Option<&'static str> {
    ARCHITECTURES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

const ARCHITECTURES: [(u32, &str); 9] = [
    (2, "Kepler"),
    (3, "Maxwell"),
    (4, "Pascal"),
    (5, "Volta"),
    (6, "Turing"),
    (7, "Ampere"),
    (8, "Ada"),
    (9, "Hopper"),
    (10, "Blackwell"),
];

/// The driver-buffer samples the fake hands out for a window with these statistics, in the
/// window's unit times `scale` (percent for ratios, mW for watts, MHz for hertz): `count` values
/// whose min, max and mean are the window's (as far as a consistent window allows).
pub fn window_values(stats: &gpumon_core::WindowStats, scale: f64) -> Vec<f64> {
    let n = stats.count.max(1) as usize;
    let (min, max, mean) = (stats.min * scale, stats.max * scale, stats.mean * scale);
    match n {
        1 => vec![mean],
        2 => vec![min, max],
        _ => {
            let fill = ((mean * n as f64 - min - max) / (n - 2) as f64).clamp(min, max);
            let mut v = Vec::with_capacity(n);
            v.push(min);
            v.extend(std::iter::repeat_n(fill, n - 2));
            v.push(max);
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_and_clamp() {
        assert_eq!(percent(0.424), 42);
        assert_eq!(percent(1.7), 100);
        assert_eq!(percent(f64::NAN), 0);
        assert_eq!(milliwatts(120.5), 120_500);
        assert_eq!(millijoules(1.2345), 1235);
        assert_eq!(megahertz(1_980_000_000.0), 1980);
        assert_eq!(celsius(-3.0), 0);
        assert_eq!(kilobytes_per_second(2048.0), 2);
        assert_eq!(architecture_code("hopper"), Some(9));
        assert_eq!(architecture_name(7), Some("Ampere"));
    }

    #[test]
    fn window_values_reproduce_the_statistics() {
        let w = gpumon_core::WindowStats::from_values([0.2, 0.9, 0.4, 0.5]).unwrap();
        let v = window_values(&w, 100.0);
        let back = gpumon_core::WindowStats::from_values(v.iter().map(|x| x / 100.0)).unwrap();
        assert_eq!(back.count, 4);
        assert!((back.min - 0.2).abs() < 1e-12 && (back.max - 0.9).abs() < 1e-12);
        assert!((back.mean - w.mean).abs() < 1e-12);
    }
}
