/*!
The Bluetooth management protocol on the wire, pure: a byte stream cut into frames, and
the frames the `ble` source reads decoded into events. Written from BlueZ's
`doc/mgmt-api.txt` (now `doc/mgmt-protocol.rst`), "Packet Structures" and the events
and commands named below; nothing here does I/O. It touches nothing but bytes.

Every frame is a 6-byte header, then its parameters:

```text
 code (u16 LE) | controller index (u16 LE) | parameter length (u16 LE) | parameters
```

The kernel writes one whole frame per read of its socket; [`Frames`] also takes a stream
cut anywhere (a test's socket pair, a recording), so frames may arrive split or several
at once. The header's length delimits a frame, so a frame that does not decode (too
short for its event, a data length beyond its end) is counted by the caller and skipped
without losing the frames after it.
*/

/// Bytes of a frame's header.
pub const HEADER_LEN: usize = 6;
/// The controller index of frames about no controller.
pub const INDEX_NONE: u16 = 0xFFFF;

/// Command Complete (`Command_Opcode`, `Status`, return parameters).
pub const EV_CMD_COMPLETE: u16 = 0x0001;
/// Command Status (`Command_Opcode`, `Status`).
pub const EV_CMD_STATUS: u16 = 0x0002;
/// Index Removed: the controller is gone.
pub const EV_INDEX_REMOVED: u16 = 0x0005;
/// Device Found: one advertising report during discovery.
pub const EV_DEVICE_FOUND: u16 = 0x0012;
/// Advertisement Monitor Removed (`Monitor_Handle`).
pub const EV_ADV_MONITOR_REMOVED: u16 = 0x002c;
/// Advertisement Monitor Device Found: `Monitor_Handle`, then as Device Found.
pub const EV_ADV_MONITOR_DEVICE_FOUND: u16 = 0x002f;

/// Read Controller Information: its address, version, settings, class and names.
pub const OP_READ_INFO: u16 = 0x0004;
/// Set Powered (`Powered`: 0 or 1).
pub const OP_SET_POWERED: u16 = 0x0005;
/// Get Connections: refused with Permission Denied on a socket without `CAP_NET_ADMIN`,
/// which the kernel binds all the same but never sends a Device Found.
pub const OP_GET_CONNECTIONS: u16 = 0x0015;
/// Read Advertisement Monitor Features: the handles of the monitors registered.
pub const OP_READ_ADV_MONITOR_FEATURES: u16 = 0x0051;
/// Add Advertisement Patterns Monitor.
pub const OP_ADD_ADV_PATTERNS_MONITOR: u16 = 0x0052;
/// Remove Advertisement Monitor.
pub const OP_REMOVE_ADV_MONITOR: u16 = 0x0053;

/// Command status: success.
pub const STATUS_SUCCESS: u8 = 0x00;
/// Command status: another command of its kind is pending.
pub const STATUS_BUSY: u8 = 0x0a;
/// Command status: the socket is not trusted (no `CAP_NET_ADMIN`).
pub const STATUS_PERMISSION_DENIED: u8 = 0x14;

/// Address type of a classic (BR/EDR) device; 1 and 2 are LE public and random.
pub const ADDRESS_BREDR: u8 = 0;
/// The RSSI value that means "not available".
pub const RSSI_UNKNOWN: i8 = 127;

/// Bytes before the advertising data in Device Found: address (6), address type (1),
/// RSSI (1), flags (4), data length (2).
const FOUND_FIXED: usize = 14;
/// Advertising data of one pattern of Add Advertisement Patterns Monitor.
pub const PATTERN_VALUE_LEN: usize = 31;

/// One frame: its code, controller index and parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub code: u16,
    pub index: u16,
    pub params: &'a [u8],
}

/// Cuts a byte stream into frames. Holds at most one partial frame (at most
/// `HEADER_LEN + 65535` bytes) between reads.
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    pub fn new() -> Frames {
        Frames::default()
    }

    /// Takes `bytes` read from the stream and calls `each` with every frame now whole,
    /// in order; keeps the rest for the next read.
    pub fn push(&mut self, bytes: &[u8], mut each: impl FnMut(Frame<'_>)) {
        if self.buf.is_empty() {
            // The common case (one read, whole frames): no copy.
            let used = cut(bytes, &mut each);
            self.buf.extend_from_slice(&bytes[used..]);
            return;
        }
        self.buf.extend_from_slice(bytes);
        let used = cut(&self.buf, &mut each);
        self.buf.drain(..used);
    }

    /// Bytes held of a frame not yet whole.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Calls `each` with every whole frame at the start of `bytes`; returns the bytes used.
fn cut(bytes: &[u8], each: &mut impl FnMut(Frame<'_>)) -> usize {
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER_LEN) {
        let len = usize::from(u16::from_le_bytes([header[4], header[5]]));
        let Some(params) = bytes.get(at + HEADER_LEN..at + HEADER_LEN + len) else {
            break;
        };
        each(Frame {
            code: u16::from_le_bytes([header[0], header[1]]),
            index: u16::from_le_bytes([header[2], header[3]]),
            params,
        });
        at += HEADER_LEN + len;
    }
    at
}

/// One advertising report: from Device Found, or Advertisement Monitor Device Found
/// (then with the monitor's handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report<'a> {
    /// As on air and as written (`AA:BB:..`): the wire's little-endian order reversed.
    pub address: [u8; 6],
    /// 0 BR/EDR, 1 LE public, 2 LE random.
    pub address_type: u8,
    /// `None` when the controller had none (127).
    pub rssi: Option<i8>,
    pub flags: u32,
    /// The advertising data (and the scan response's, appended, in active scans).
    pub data: &'a [u8],
    pub monitor: Option<u16>,
}

/// What a frame the source reads says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    Report(Report<'a>),
    /// A command's answer (Command Complete or Command Status).
    CommandDone {
        opcode: u16,
        status: u8,
        params: &'a [u8],
    },
    MonitorRemoved {
        handle: u16,
    },
    IndexRemoved,
    /// An event the source has no use for.
    Other,
}

/// Why a frame does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("event 0x{code:04x} has {len} bytes of parameters, fewer than its {need}")]
    Short { code: u16, len: usize, need: usize },
    #[error("event 0x{code:04x} says {said} bytes of advertising data, {left} follow")]
    DataLength { code: u16, said: usize, left: usize },
}

/// Decodes a frame into the event the source acts on.
pub fn decode(frame: Frame<'_>) -> Result<Event<'_>, Malformed> {
    let p = frame.params;
    let short = |need: usize| Malformed::Short {
        code: frame.code,
        len: p.len(),
        need,
    };
    match frame.code {
        EV_DEVICE_FOUND => report(frame.code, p, None).map(Event::Report),
        EV_ADV_MONITOR_DEVICE_FOUND => {
            let [a, b, ..] = *p else {
                return Err(short(2 + FOUND_FIXED));
            };
            let handle = u16::from_le_bytes([a, b]);
            report(frame.code, &p[2..], Some(handle)).map(Event::Report)
        }
        EV_CMD_COMPLETE | EV_CMD_STATUS => match *p {
            [a, b, status, ..] => Ok(Event::CommandDone {
                opcode: u16::from_le_bytes([a, b]),
                status,
                params: &p[3..],
            }),
            _ => Err(short(3)),
        },
        EV_ADV_MONITOR_REMOVED => match *p {
            [a, b, ..] => Ok(Event::MonitorRemoved {
                handle: u16::from_le_bytes([a, b]),
            }),
            _ => Err(short(2)),
        },
        EV_INDEX_REMOVED => Ok(Event::IndexRemoved),
        _ => Ok(Event::Other),
    }
}

/// The report in `p` (Device Found's parameters).
fn report(code: u16, p: &[u8], monitor: Option<u16>) -> Result<Report<'_>, Malformed> {
    let Some(fixed) = p.get(..FOUND_FIXED) else {
        return Err(Malformed::Short {
            code,
            len: p.len() + if monitor.is_some() { 2 } else { 0 },
            need: FOUND_FIXED + if monitor.is_some() { 2 } else { 0 },
        });
    };
    let said = usize::from(u16::from_le_bytes([fixed[12], fixed[13]]));
    let left = p.len() - FOUND_FIXED;
    // The kernel sends exactly the data it says; more bytes than said are ignored,
    // fewer cannot be a report.
    if said > left {
        return Err(Malformed::DataLength { code, said, left });
    }
    let a = &fixed[..6];
    let rssi = fixed[7] as i8;
    Ok(Report {
        address: [a[5], a[4], a[3], a[2], a[1], a[0]],
        address_type: fixed[6],
        rssi: (rssi != RSSI_UNKNOWN).then_some(rssi),
        flags: u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]),
        data: &p[FOUND_FIXED..FOUND_FIXED + said],
        monitor,
    })
}

/// A command frame for controller `index`.
pub fn command(opcode: u16, index: u16, params: &[u8]) -> Vec<u8> {
    let len = u16::try_from(params.len()).unwrap_or(u16::MAX);
    let mut frame = Vec::with_capacity(HEADER_LEN + params.len());
    frame.extend_from_slice(&opcode.to_le_bytes());
    frame.extend_from_slice(&index.to_le_bytes());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&params[..usize::from(len)]);
    frame
}

/// One pattern of an advertisement monitor: advertising data of `ad_type` whose bytes
/// from `offset` are `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pub ad_type: u8,
    pub offset: u8,
    pub value: Vec<u8>,
}

/// The parameters of Add Advertisement Patterns Monitor: `Pattern_Count`, then each
/// pattern as `AD_Type`, `Offset`, `Length` and a 31-byte `Value` (zero-padded).
/// `None` when a pattern does not fit the command (more than 31 bytes, or past the
/// 31 bytes of legacy advertising data).
pub fn monitor_patterns(patterns: &[Pattern]) -> Option<Vec<u8>> {
    let count = u8::try_from(patterns.len()).ok()?;
    let mut params = vec![count];
    for p in patterns {
        let len = p.value.len();
        if len == 0 || len > PATTERN_VALUE_LEN || usize::from(p.offset) + len > PATTERN_VALUE_LEN {
            return None;
        }
        params.extend_from_slice(&[p.ad_type, p.offset, len as u8]);
        let mut value = [0u8; PATTERN_VALUE_LEN];
        value[..len].copy_from_slice(&p.value);
        params.extend_from_slice(&value);
    }
    Some(params)
}

/// The current settings in the return parameters of Read Controller Information
/// (after the address (6 octets), version (1), manufacturer (2) and supported
/// settings (4)); bit 0 is Powered.
pub fn current_settings(info: &[u8]) -> Option<u32> {
    let s = info.get(13..17)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// The Powered bit of the settings.
pub const SETTING_POWERED: u32 = 1;

/// The monitor handles in the return parameters of Read Advertisement Monitor
/// Features: supported and enabled features (4 octets each), the maximum handles (2)
/// and patterns (1), the number of handles (2), the handles (2 each). Short parameters
/// give what they hold.
pub fn monitor_handles(ret: &[u8]) -> Vec<u16> {
    let Some(&[lo, hi]) = ret.get(11..13) else {
        return Vec::new();
    };
    let n = usize::from(u16::from_le_bytes([lo, hi]));
    ret.get(13..)
        .unwrap_or_default()
        .chunks_exact(2)
        .take(n)
        .map(|h| u16::from_le_bytes([h[0], h[1]]))
        .collect()
}

pub mod build;

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    const TAPE: [u8; 6] = [0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01];

    fn frames_of(stream: &[u8], cut_at: &[usize]) -> Vec<(u16, u16, Vec<u8>)> {
        let mut frames = Frames::new();
        let mut out = Vec::new();
        let mut from = 0;
        for &to in cut_at.iter().chain(std::iter::once(&stream.len())) {
            frames.push(&stream[from..to], |f| {
                out.push((f.code, f.index, f.params.to_vec()))
            });
            from = to;
        }
        out
    }

    #[test]
    fn a_stream_cut_anywhere_gives_the_same_frames() {
        let mut stream = device_found(0, TAPE, -60, &ad(0xFF, &[0xF7, 0x0E, 1, 2]));
        stream.extend(frame(0x0006, 0, &[1, 0, 0, 0]));
        stream.extend(frame(0x0013, 0, &[]));
        let whole = frames_of(&stream, &[]);
        assert_eq!(whole.len(), 3);
        for cut in 0..=stream.len() {
            assert_eq!(frames_of(&stream, &[cut]), whole, "cut at {cut}");
        }
        let bytewise: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(frames_of(&stream, &bytewise), whole);
    }

    #[test]
    fn a_partial_frame_waits_for_the_rest() {
        let stream = device_found(0, TAPE, -60, &[]);
        let mut frames = Frames::new();
        let mut n = 0;
        frames.push(&stream[..10], |_| n += 1);
        assert_eq!((n, frames.pending()), (0, 10));
        frames.push(&stream[10..], |_| n += 1);
        assert_eq!((n, frames.pending()), (1, 0));
    }

    #[test]
    fn device_found_decodes_as_documented() {
        let data = ad(0xFF, &[0xF7, 0x0E, 0x49, 0x56]);
        let f = device_found(3, TAPE, -61, &data);
        // The header: code, index, length, little-endian.
        assert_eq!(&f[..6], &[0x12, 0x00, 0x03, 0x00, 14 + 6, 0x00]);
        // The address on the wire is little-endian: the last octet first.
        assert_eq!(&f[6..12], &[0x01, 0x00, 0x00, 0xEE, 0xFF, 0xC0]);
        let mut frames = Frames::new();
        let mut got = None;
        frames.push(&f, |fr| {
            assert_eq!(fr.index, 3);
            got = Some(match decode(fr).unwrap() {
                Event::Report(r) => (r.address, r.address_type, r.rssi, r.data.to_vec()),
                e => panic!("{e:?}"),
            });
        });
        assert_eq!(got, Some((TAPE, 2, Some(-61), data)));
    }

    #[test]
    fn a_monitor_report_carries_its_handle_and_the_same_fields() {
        let f = monitor_found(0, 7, TAPE, -70, &[2, 0x01, 0x06]);
        let params = &f[HEADER_LEN..];
        let e = decode(Frame {
            code: EV_ADV_MONITOR_DEVICE_FOUND,
            index: 0,
            params,
        })
        .unwrap();
        let Event::Report(r) = e else { panic!("{e:?}") };
        assert_eq!(
            (r.monitor, r.address, r.rssi, r.data),
            (Some(7), TAPE, Some(-70), &[2, 0x01, 0x06][..])
        );
    }

    #[test]
    fn rssi_127_is_no_rssi() {
        let f = device_found(0, TAPE, 127, &[]);
        let Ok(Event::Report(r)) = decode(Frame {
            code: EV_DEVICE_FOUND,
            index: 0,
            params: &f[HEADER_LEN..],
        }) else {
            panic!()
        };
        assert_eq!(r.rssi, None);
    }

    #[test]
    fn short_and_overlong_reports_are_malformed_not_panics() {
        let full = found_params(TAPE, 2, -60, &[1, 2, 3]);
        for len in 0..FOUND_FIXED {
            let e = decode(Frame {
                code: EV_DEVICE_FOUND,
                index: 0,
                params: &full[..len],
            });
            assert!(
                matches!(e, Err(Malformed::Short { need: 14, .. })),
                "{len}: {e:?}"
            );
        }
        // The data length says 3, only 2 follow.
        let e = decode(Frame {
            code: EV_DEVICE_FOUND,
            index: 0,
            params: &full[..FOUND_FIXED + 2],
        });
        assert_eq!(
            e,
            Err(Malformed::DataLength {
                code: EV_DEVICE_FOUND,
                said: 3,
                left: 2
            })
        );
        for code in [
            EV_ADV_MONITOR_DEVICE_FOUND,
            EV_CMD_COMPLETE,
            EV_ADV_MONITOR_REMOVED,
        ] {
            assert!(decode(Frame {
                code,
                index: 0,
                params: &[1]
            })
            .is_err());
        }
    }

    #[test]
    fn unknown_events_are_other() {
        for code in [0x0000, 0x0006, 0x0013, 0x0031, 0xFFFF] {
            let e = decode(Frame {
                code,
                index: 0,
                params: &[9; 40],
            });
            assert_eq!(e, Ok(Event::Other), "0x{code:04x}");
        }
    }

    #[test]
    fn command_frames_are_laid_out_as_documented() {
        assert_eq!(
            command(OP_GET_CONNECTIONS, 1, &[]),
            vec![0x15, 0x00, 0x01, 0x00, 0x00, 0x00]
        );
        let params = monitor_patterns(&[Pattern {
            ad_type: 0xFF,
            offset: 0,
            value: vec![0xF7, 0x0E],
        }])
        .unwrap();
        assert_eq!(params.len(), 1 + 34);
        assert_eq!(&params[..6], &[1, 0xFF, 0, 2, 0xF7, 0x0E]);
        assert!(params[6..].iter().all(|b| *b == 0));
        let too_long = Pattern {
            ad_type: 0xFF,
            offset: 30,
            value: vec![1, 2],
        };
        assert_eq!(monitor_patterns(&[too_long]), None);
    }
    #[test]
    fn the_monitor_handles_are_read_from_the_features_answer() {
        let mut ret = vec![0u8; 8];
        ret.extend(32u16.to_le_bytes());
        ret.push(16);
        ret.extend(2u16.to_le_bytes());
        ret.extend(3u16.to_le_bytes());
        ret.extend(9u16.to_le_bytes());
        assert_eq!(monitor_handles(&ret), vec![3, 9]);
        assert_eq!(
            monitor_handles(&ret[..15]),
            vec![3],
            "a short answer gives what it holds"
        );
        assert_eq!(monitor_handles(&ret[..5]), Vec::<u16>::new());
    }
}
