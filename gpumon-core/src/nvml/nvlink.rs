//! NVLink through NVML: static link facts once per GPU, then state and counters with one
//! batched `nvmlDeviceGetFieldValues` per GPU per tick (per-link calls cost milliseconds on a
//! real driver).
//!
//! * Discovery: field `NVML_FI_DEV_NVLINK_LINK_COUNT`; no links (or `NOT_SUPPORTED`) means the
//!   GPU has no NVLink and its samples carry no `nvlink` at all. Then per link
//!   `nvmlDeviceGetNvLinkVersion`, `…RemotePciInfo_v2`, `…RemoteDeviceType`.
//! * Per tick, per link (`scopeId` = link): `NVML_FI_DEV_NVLINK_GET_STATE`,
//!   `…THROUGHPUT_DATA_TX/RX` (KiB counters), `…ERROR_DL_CRC/REPLAY/RECOVERY`.

use std::mem;
use std::os::raw::{c_int, c_uint};

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use super::read::Reader;
use crate::metric::Family;
use crate::model::{Nvlink, NvlinkLink, NvlinkRemote, NvlinkState};

const FI_LINK_COUNT: u32 = 91;
const FI_DATA_TX: u32 = 138;
const FI_DATA_RX: u32 = 139;
const FI_REPLAY: u32 = 161;
const FI_RECOVERY: u32 = 162;
const FI_CRC: u32 = 163;
const FI_STATE: u32 = 165;
/// Fields read per link per tick, in this order.
const PER_TICK: [u32; 6] = [FI_STATE, FI_DATA_TX, FI_DATA_RX, FI_CRC, FI_REPLAY, FI_RECOVERY];
/// `NVML_NVLINK_MAX_LINKS`.
const MAX_LINKS: u32 = 18;
/// NVML counts NVLink throughput in KiB.
const KIB: u64 = 1024;

/// One batched field-values call; entry `i` is `(field, scope)` of `fields[i]`.
fn field_values(nvml: &Nvml, d: &Device<'_>, fields: &[(u32, u32)]) -> Result<Vec<sys::nvmlFieldValue_t>, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<sys::nvmlFieldValue_t> = fields
        .iter()
        .map(|&(field, scope)| {
            // SAFETY: plain C struct; all-zero is a valid starting value.
            let mut v: sys::nvmlFieldValue_t = unsafe { mem::zeroed() };
            v.fieldId = field;
            v.scopeId = scope;
            v
        })
        .collect();
    // SAFETY: a live handle and `values.len()` initialised entries.
    nvml_try(unsafe { f(d.handle(), values.len() as c_int, values.as_mut_ptr()) })?;
    Ok(values)
}

// `c_ulong` is `u64` on LP64 targets but not everywhere, so the conversion is not useless.
#[allow(clippy::useless_conversion)]
fn as_u64(v: &sys::nvmlFieldValue_t) -> Option<u64> {
    if v.nvmlReturn != sys::nvmlReturn_enum_NVML_SUCCESS {
        return None;
    }
    // SAFETY: the union member is the one `valueType` names.
    unsafe {
        match v.valueType {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(u64::from(v.value.uiVal)),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(u64::from(v.value.ulVal)),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(v.value.ullVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => u64::try_from(v.value.sllVal).ok(),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => u64::try_from(v.value.siVal).ok(),
            _ => None,
        }
    }
}

/// The GPU's links with their static facts (version, remote end); empty without NVLink.
/// `Err` only for errors the caller must see (a lost GPU, no permission).
pub(crate) fn discover(nvml: &Nvml, d: &Device<'_>, r: &mut Reader<'_>) -> Vec<NvlinkLink> {
    let count = match field_values(nvml, d, &[(FI_LINK_COUNT, 0)]) {
        Ok(v) => v.first().and_then(as_u64).unwrap_or(0),
        Err(e) => {
            r.note(Family::Nvlink, &e);
            0
        }
    };
    let lib = nvml.lib();
    let handle = unsafe { d.handle() };
    (0..(count as u32).min(MAX_LINKS))
        .map(|link| {
            let mut l = NvlinkLink::new(link);
            if let Ok(f) = nvml_sym(lib.nvmlDeviceGetNvLinkVersion.as_ref()) {
                let mut v: c_uint = 0;
                // SAFETY: a live handle and a valid out-pointer.
                l.version = nvml_try(unsafe { f(handle, link, &mut v) }).ok().map(|()| v);
            }
            if let Ok(f) = nvml_sym(lib.nvmlDeviceGetNvLinkRemotePciInfo_v2.as_ref()) {
                // SAFETY: plain C struct; all-zero is valid.
                let mut p: sys::nvmlPciInfo_t = unsafe { mem::zeroed() };
                // SAFETY: a live handle and a valid out-pointer.
                if nvml_try(unsafe { f(handle, link, &mut p) }).is_ok() {
                    let id: Vec<u8> = p.busId.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
                    l.remote_pci_bus_id = String::from_utf8(id).ok().filter(|s| !s.is_empty());
                }
            }
            if let Ok(f) = nvml_sym(lib.nvmlDeviceGetNvLinkRemoteDeviceType.as_ref()) {
                let mut t: sys::nvmlIntNvLinkDeviceType_t = 0;
                // SAFETY: a live handle and a valid out-pointer.
                if nvml_try(unsafe { f(handle, link, &mut t) }).is_ok() {
                    l.remote_device_type = Some(NvlinkRemote::from_nvml(t));
                }
            }
            l
        })
        .collect()
}

/// `nvmlDeviceGetNvLinkState` of one link (1 active, 0 not); `None` when it fails.
fn link_state(nvml: &Nvml, d: &Device<'_>, link: u32) -> Option<u64> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkState.as_ref()).ok()?;
    let mut v: sys::nvmlEnableState_t = 0;
    // SAFETY: a live handle and a valid out-pointer.
    nvml_try(unsafe { f(d.handle(), link, &mut v) }).ok().map(|()| u64::from(v))
}

/// This tick's state and counters of `links` (static facts kept), in one field-values call.
pub(crate) fn read(nvml: &Nvml, d: &Device<'_>, links: &[NvlinkLink], r: &mut Reader<'_>) -> Option<Nvlink> {
    if links.is_empty() {
        return None;
    }
    let fields: Vec<(u32, u32)> = links.iter().flat_map(|l| PER_TICK.iter().map(move |&f| (f, l.link))).collect();
    let values = match field_values(nvml, d, &fields) {
        Ok(v) => v,
        Err(e) => {
            r.note(Family::Nvlink, &e);
            return None;
        }
    };
    let mut out = Vec::with_capacity(links.len());
    for (l, chunk) in links.iter().zip(values.chunks(PER_TICK.len())) {
        for v in chunk {
            if v.nvmlReturn != sys::nvmlReturn_enum_NVML_SUCCESS {
                r.note(Family::Nvlink, &NvmlError::from(v.nvmlReturn));
            }
        }
        let get = |i: usize| chunk.get(i).and_then(as_u64);
        let mut link = l.clone();
        // Drivers before `NVML_FI_DEV_NVLINK_GET_STATE` (R525) answer it NOT_SUPPORTED: ask
        // the per-link call instead rather than report every link down.
        let state = get(0).or_else(|| link_state(nvml, d, l.link));
        link.state = if state == Some(1) { NvlinkState::Up } else { NvlinkState::Down };
        link.tx_bytes = get(1).map(|k| k * KIB);
        link.rx_bytes = get(2).map(|k| k * KIB);
        link.crc_errors = get(3);
        link.replay_errors = get(4);
        link.recovery_errors = get(5);
        out.push(link);
    }
    if r.lost {
        return None;
    }
    Some(Nvlink::new(out))
}
