//! What the live stream sends: the snapshot as the page draws it, and compressed once per tick.
//!
//! [`PageSnapshot`] has the JSON shape of `gpumon_core::Snapshot` (so `app.js` reads the stream
//! and `/api/snapshot` alike) with only the fields the page uses: no NVLink per-link list (its
//! totals instead), no driver-buffered windows, no GPM, no static limits, no stage output
//! other than `diagnosis` and `steps`. For 8 H100s that is most of an event's bytes (the
//! NVLink links alone were 4.1 KB per GPU).
//!
//! Compression ([`deflate_segment`]): each event is deflated on its own, ending with a *full
//! flush* (it refers to no earlier bytes and ends on a byte boundary). A gzip stream is then
//! the gzip header followed by any sequence of such segments, so one compressed copy per tick
//! serves every client, whenever it joined — and each event decodes as soon as it arrives.
//! The stream never gets a gzip trailer: it ends when the connection does.

use bytes::Bytes;
use gpumon_core::attribution::SharedOwner;
use gpumon_core::{
    ClockEventReasons, DeviceSample, DeviceState, Ecc, MetricFailure, MigInfo, Nvlink, Pcie, Snapshot, Temperature,
    XidCount,
};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;

/// The page's view of a snapshot (see the module docs).
pub(crate) struct PageSnapshot<'a>(pub(crate) &'a Snapshot);

impl Serialize for PageSnapshot<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let s = self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("seq", &s.seq)?;
        map.serialize_entry("taken_at", &s.timestamp_nanos())?;
        map.serialize_entry("system", &*s.system)?;
        if !s.sampling.is_ok() {
            map.serialize_entry("sampling", &s.sampling)?;
        }
        map.serialize_entry("devices", &Devices(&s.devices))?;
        for output in s.outputs.iter() {
            let key = output.key();
            if !matches!(key, "diagnosis" | "steps") {
                continue;
            }
            if let Some(value) = output.as_serialize() {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

struct Devices<'a>(&'a [DeviceSample]);

impl Serialize for Devices<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for d in self.0 {
            seq.serialize_element(&PageDevice::of(d))?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct PageDevice<'a> {
    info: PageInfo<'a>,
    state: DeviceState,
    utilization: PageUtilization,
    memory: PageMemory,
    temperature: &'a Temperature,
    power: PagePower,
    clocks: PageClocks,
    fan_speed: Option<f64>,
    performance_state: Option<u32>,
    clock_event_reasons: Option<ClockEventReasons>,
    pcie: &'a Pcie,
    ecc: &'a Ecc,
    xid_errors: &'a [XidCount],
    processes: Vec<PageProcess<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nvlink: Option<PageNvlink>,
    errors: &'a [MetricFailure],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    owners: &'a [SharedOwner],
}

impl<'a> PageDevice<'a> {
    fn of(d: &'a DeviceSample) -> Self {
        let i = &d.info;
        PageDevice {
            info: PageInfo {
                index: i.index,
                uuid: &i.uuid,
                name: &i.name,
                pci_bus_id: i.pci_bus_id.as_deref(),
                mig: i.mig.as_ref(),
                pcie_max_link_generation: i.pcie_max_link_generation,
                pcie_max_link_width: i.pcie_max_link_width,
            },
            state: d.state,
            utilization: PageUtilization { gpu: d.utilization.gpu },
            memory: PageMemory { used: d.memory.used, total: d.memory.total },
            temperature: &d.temperature,
            power: PagePower { usage_watts: d.power.usage_watts, limit_watts: d.power.limit_watts },
            clocks: PageClocks { sm: d.clocks.sm },
            fan_speed: d.fan_speed,
            performance_state: d.performance_state,
            clock_event_reasons: d.clock_event_reasons,
            pcie: &d.pcie,
            ecc: &d.ecc,
            xid_errors: &d.xid_errors,
            processes: d
                .processes
                .iter()
                .map(|p| PageProcess {
                    pid: p.pid,
                    name: p.name.as_deref(),
                    memory_used: p.memory_used,
                    sm_utilization: p.sm_utilization,
                    owner: p.owner.as_ref(),
                })
                .collect(),
            nvlink: d.nvlink.as_ref().map(PageNvlink::of),
            errors: &d.errors,
            owners: &d.owners,
        }
    }
}

#[derive(Serialize)]
struct PageInfo<'a> {
    index: u32,
    uuid: &'a str,
    name: &'a str,
    pci_bus_id: Option<&'a str>,
    mig: Option<&'a MigInfo>,
    pcie_max_link_generation: Option<u32>,
    pcie_max_link_width: Option<u32>,
}

#[derive(Serialize)]
struct PageUtilization {
    gpu: Option<f64>,
}

#[derive(Serialize)]
struct PageMemory {
    used: Option<u64>,
    total: Option<u64>,
}

#[derive(Serialize)]
struct PagePower {
    usage_watts: Option<f64>,
    limit_watts: Option<f64>,
}

#[derive(Serialize)]
struct PageClocks {
    sm: Option<f64>,
}

#[derive(Serialize)]
struct PageProcess<'a> {
    pid: u32,
    name: Option<&'a str>,
    memory_used: Option<u64>,
    sm_utilization: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a SharedOwner>,
}

/// A device's NVLink links summed: `{"totals": {...}}` (the page shows totals only).
#[derive(Serialize)]
struct PageNvlink {
    totals: NvlinkTotals,
}

#[derive(Serialize, Default)]
struct NvlinkTotals {
    links: u32,
    up: u32,
    tx_bytes: u64,
    rx_bytes: u64,
    crc_errors: u64,
    replay_errors: u64,
    recovery_errors: u64,
}

impl PageNvlink {
    fn of(nvlink: &Nvlink) -> Self {
        let mut t = NvlinkTotals::default();
        for l in &nvlink.links {
            t.links += 1;
            t.up += u32::from(l.is_up());
            t.tx_bytes = t.tx_bytes.saturating_add(l.tx_bytes.unwrap_or(0));
            t.rx_bytes = t.rx_bytes.saturating_add(l.rx_bytes.unwrap_or(0));
            t.crc_errors = t.crc_errors.saturating_add(l.crc_errors.unwrap_or(0));
            t.replay_errors = t.replay_errors.saturating_add(l.replay_errors.unwrap_or(0));
            t.recovery_errors = t.recovery_errors.saturating_add(l.recovery_errors.unwrap_or(0));
        }
        PageNvlink { totals: t }
    }
}

/// The first bytes of a gzip stream: magic, deflate, no flags, no time, unknown OS.
pub(crate) const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// `data` deflated on its own and ended with a full flush: a piece of a deflate stream that
/// refers to nothing before it and decodes completely once received (see the module docs).
pub(crate) fn deflate_segment(data: &[u8]) -> Bytes {
    use flate2::{Compress, Compression, FlushCompress};
    let mut c = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(data.len() / 4 + 64);
    loop {
        let consumed = usize::try_from(c.total_in()).unwrap_or(data.len()).min(data.len());
        // Compressing into a Vec has no failure mode but a full buffer, handled below.
        if c.compress_vec(&data[consumed..], &mut out, FlushCompress::Full).is_err() {
            break;
        }
        // zlib: the flush is complete once a call returns with output space left.
        if c.total_in() as usize == data.len() && out.len() < out.capacity() {
            break;
        }
        out.reserve(out.capacity().max(1024));
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    /// A gzip stream made of the header and segments deflated independently decodes to the
    /// events in order, each as soon as its segment arrived (no trailer needed).
    #[test]
    fn segments_after_a_gzip_header_decode_one_by_one() {
        let events: Vec<String> = (0..5)
            .map(|i| format!("event: snapshot\ndata: {{\"seq\":{i},\"x\":\"{}\"}}\n\n", "ab".repeat(500 * i)))
            .collect();
        let mut stream = GZIP_HEADER.to_vec();
        let mut ends = Vec::new();
        for e in &events {
            stream.extend_from_slice(&deflate_segment(e.as_bytes()));
            ends.push(stream.len());
        }
        // Every prefix that ends on a segment decodes to exactly the events so far.
        for (n, end) in ends.iter().enumerate() {
            let mut decoder = flate2::read::GzDecoder::new(&stream[..*end]);
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            // A stream without trailer ends in an error at EOF, after all the data.
            loop {
                match decoder.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => out.extend_from_slice(&buf[..k]),
                }
            }
            assert_eq!(String::from_utf8(out).unwrap(), events[..=n].concat());
        }
        // And a segment is much smaller than its event.
        assert!(deflate_segment(events[4].as_bytes()).len() * 10 < events[4].len());
    }
}
