//! [`Reports`]: the frames of one controller turned into adverts and into what the
//! source acts on beside them ([`Control`]), counted ([`Counts`]). Pure: the time is
//! passed in. It touches the frames (`wire.rs`), the AD structures (`ad.rs`) and the
//! records.

use hashlink::LruCache;

use super::ad;
use super::wire::{self, Event, Frame};
use crate::record::{Advertisement, EpochMillis, Mac};

/// What the side channel has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// LE reports of the configured controller, turned into adverts.
    pub reports: u64,
    /// Frames that did not decode, skipped.
    pub malformed: u64,
    /// Reports whose advertising data ended inside a structure (kept up to it).
    pub truncated: u64,
    /// Reports of other controllers, skipped.
    pub other_adapters: u64,
    /// Reports of classic (BR/EDR) devices, skipped.
    pub classic: u64,
}

/// What a frame says beside adverts, for the source to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// The answer to a command on this controller.
    CommandDone {
        opcode: u16,
        status: u8,
        params: Vec<u8>,
    },
    /// An advertisement monitor was removed (by another socket).
    MonitorRemoved(u16),
    /// The controller went away.
    AdapterGone,
}

/// Turns the frames of one controller into adverts. Pure: time is passed in.
pub struct Reports {
    pub(super) index: u16,
    /// Names heard of each device, and whether complete: a report without one (an
    /// advert whose name is in the scan response) takes it, and a shortened one gives
    /// way to a complete one heard before, as BlueZ's `Name` property does.
    names: LruCache<Mac, (Box<str>, bool)>,
    counts: Counts,
}

impl Reports {
    /// Reports of controller `index` (`hci0` is 0), remembering the names of at most
    /// `max_devices` devices.
    pub fn new(index: u16, max_devices: usize) -> Reports {
        Reports {
            index,
            names: LruCache::new(max_devices.max(1)),
            counts: Counts::default(),
        }
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Follows another controller from now on.
    pub fn set_index(&mut self, index: u16) {
        if index != self.index {
            self.index = index;
            self.names.clear();
        }
    }

    /// Handles one frame heard at `ts_ms`: a report becomes an advert for `advert`;
    /// anything the source must act on is returned.
    pub fn frame(
        &mut self,
        frame: Frame<'_>,
        ts_ms: EpochMillis,
        advert: &mut impl FnMut(Advertisement),
    ) -> Option<Control> {
        let event = match wire::decode(frame) {
            Ok(e) => e,
            Err(e) => {
                self.counts.malformed += 1;
                if self.counts.malformed == 1 {
                    tracing::warn!(error = %e, "a malformed frame from the kernel's management socket was skipped (further ones are counted, logged at DEBUG)");
                } else {
                    tracing::debug!(error = %e, "malformed management frame skipped");
                }
                return None;
            }
        };
        if frame.index != self.index {
            if matches!(event, Event::Report(_)) {
                self.counts.other_adapters += 1;
            }
            return None;
        }
        match event {
            Event::Report(r) => {
                if r.address_type == wire::ADDRESS_BREDR {
                    self.counts.classic += 1;
                    return None;
                }
                self.counts.reports += 1;
                let mac = Mac::new(r.address);
                let mut fields = ad::parse(r.data);
                if fields.truncated {
                    self.counts.truncated += 1;
                }
                self.name(mac, &mut fields);
                advert(fields.into_advert(ts_ms, mac, r.rssi.map(i16::from)));
                None
            }
            Event::CommandDone {
                opcode,
                status,
                params,
            } => Some(Control::CommandDone {
                opcode,
                status,
                params: params.to_vec(),
            }),
            Event::MonitorRemoved { handle } => Some(Control::MonitorRemoved(handle)),
            Event::IndexRemoved => Some(Control::AdapterGone),
            Event::Other => None,
        }
    }
}

impl Reports {
    /// Completes `fields`' name from what was heard of `mac` before, and remembers it.
    fn name(&mut self, mac: Mac, fields: &mut ad::Fields) {
        let (same, known_complete) = match self.names.peek(&mac) {
            Some((n, complete)) => (
                fields.name.as_deref() == Some(&**n) && *complete == fields.complete_name,
                *complete,
            ),
            None => (false, false),
        };
        match &fields.name {
            Some(name) if fields.complete_name || !known_complete => {
                if !same {
                    self.names
                        .insert(mac, (name.as_str().into(), fields.complete_name));
                }
            }
            _ => fields.name = self.names.get(&mac).map(|(n, _)| n.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::build::*;
    use super::super::wire::Frames;
    use super::*;

    const TAPE: [u8; 6] = [0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01];

    fn adverts(reports: &mut Reports, stream: &[u8]) -> (Vec<Advertisement>, Vec<Control>) {
        let (mut out, mut ctl) = (Vec::new(), Vec::new());
        Frames::new().push(stream, |f| {
            if let Some(c) = reports.frame(f, 1_000, &mut |a| out.push(a)) {
                ctl.push(c);
            }
        });
        (out, ctl)
    }

    fn tape_data(counter: u8) -> Vec<u8> {
        let mut d = ad(0x01, &[0x06]);
        d.extend(ad(0xFF, &[0xF7, 0x0E, 0x49, 0x56, counter]));
        d
    }

    #[test]
    fn only_the_configured_controllers_le_reports_become_adverts() {
        let mut r = Reports::new(1, 16);
        let mut stream = device_found(1, TAPE, -60, &tape_data(1));
        stream.extend(device_found(0, TAPE, -60, &tape_data(2)));
        stream.extend(frame(
            wire::EV_DEVICE_FOUND,
            1,
            &found_params(TAPE, wire::ADDRESS_BREDR, -60, &[]),
        ));
        stream.extend(monitor_found(1, 0, TAPE, -55, &tape_data(3)));
        let (out, ctl) = adverts(&mut r, &stream);
        assert!(ctl.is_empty());
        assert_eq!(
            out,
            vec![
                Advertisement {
                    ts_ms: 1_000,
                    mac: Mac::new(TAPE),
                    rssi: Some(-60),
                    name: None,
                    manufacturer_data: vec![(0x0EF7, vec![0x49, 0x56, 1])],
                    service_data: vec![],
                },
                Advertisement {
                    ts_ms: 1_000,
                    mac: Mac::new(TAPE),
                    rssi: Some(-55),
                    name: None,
                    manufacturer_data: vec![(0x0EF7, vec![0x49, 0x56, 3])],
                    service_data: vec![],
                },
            ]
        );
        assert_eq!(
            r.counts(),
            Counts {
                reports: 2,
                other_adapters: 1,
                classic: 1,
                ..Counts::default()
            }
        );
    }

    #[test]
    fn a_name_heard_once_completes_the_reports_without_one() {
        let mut r = Reports::new(0, 16);
        let mut named = tape_data(1);
        named.extend(ad(0x09, b"TT-0001"));
        let mut stream = device_found(0, TAPE, -60, &tape_data(0));
        stream.extend(device_found(0, TAPE, -60, &named));
        stream.extend(device_found(0, TAPE, -60, &tape_data(2)));
        let (out, _) = adverts(&mut r, &stream);
        let names: Vec<_> = out.iter().map(|a| a.name.as_deref()).collect();
        assert_eq!(names, vec![None, Some("TT-0001"), Some("TT-0001")]);
    }

    #[test]
    fn answers_and_monitor_and_adapter_events_reach_the_source() {
        let mut r = Reports::new(0, 16);
        let mut stream = command_complete(0, wire::OP_ADD_ADV_PATTERNS_MONITOR, 0, &[5, 0]);
        stream.extend(frame(wire::EV_ADV_MONITOR_REMOVED, 0, &[5, 0]));
        stream.extend(frame(wire::EV_INDEX_REMOVED, 0, &[]));
        stream.extend(frame(wire::EV_INDEX_REMOVED, 1, &[]));
        let (_, ctl) = adverts(&mut r, &stream);
        assert_eq!(
            ctl,
            vec![
                Control::CommandDone {
                    opcode: wire::OP_ADD_ADV_PATTERNS_MONITOR,
                    status: 0,
                    params: vec![5, 0]
                },
                Control::MonitorRemoved(5),
                Control::AdapterGone,
            ]
        );
    }
}
