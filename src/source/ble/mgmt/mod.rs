/*!
The side channel: advertising reports read from the kernel's Bluetooth management socket
beside bluetoothd, as Home Assistant's `habluetooth` does (its
`channels/bluez.py` reader), instead of one D-Bus signal per advert through
dbus-daemon. bluetoothd keeps owning the adapter: the `ble` source still starts and
keeps discovery alive over D-Bus; the kernel sends every management socket a copy of
each report (`Device Found`, and `Advertisement Monitor Device Found` while a monitor
scans passively), with its own RSSI and the raw advertising data.
It touches the kernel's socket (through `socket.rs`) and the records.

- `wire.rs`: frames and events, pure (the layouts of BlueZ's doc/mgmt-api.txt);
- `ad.rs`: the advertising data's AD structures, pure;
- `socket.rs`: opening the socket and reading and writing frames;
- this file: [`Reports`] turns frames into [`Advertisement`]s for one controller, and
  [`Channel`] joins it to a socket.

The kernel sends reports only to sockets opened with `CAP_NET_ADMIN` ("trusted"); it
binds the others all the same. So a channel is usable only once the kernel has
answered a command that needs trust ([`Channel::open`]): Get Connections, refused with
Permission Denied otherwise.

A frame that does not decode is counted ([`Counts::malformed`]) and skipped; the first
is logged at WARN with what was wrong, the rest at DEBUG. Reports of other controllers
and of classic (BR/EDR) devices are skipped and counted.
*/

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use hashlink::LruCache;

use crate::record::{Advertisement, EpochMillis, Mac};

pub mod ad;
pub mod socket;
pub mod wire;

use wire::{Event, Frame, Frames};

/// Set to a Unix seqpacket socket's path, management frames are read from the peer
/// listening there instead of the kernel (tests and benchmarks; logged at WARN).
pub const SOCKET_ENV: &str = "TAPEGATE_MGMT_SOCKET";

/// How long opening waits for the kernel's answer to the trust probe.
const PROBE_WAIT: Duration = Duration::from_secs(2);
/// The largest frame: header and 65535 bytes of parameters.
const READ_BUF: usize = wire::HEADER_LEN + 65535;

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
    index: u16,
    /// Names heard of each device: a report without one (an advert whose name is in
    /// the scan response) takes the last, as BlueZ's `Name` property would.
    names: LruCache<Mac, Box<str>>,
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
                match &fields.name {
                    Some(name) => {
                        if self.names.peek(&mac).is_none_or(|n| **n != **name) {
                            self.names.insert(mac, name.as_str().into());
                        }
                    }
                    None => fields.name = self.names.get(&mac).map(|n| n.to_string()),
                }
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

/// Why the side channel cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("the kernel has no Bluetooth management socket here ({0})")]
    Socket(String),
    #[error("the kernel sends advertising reports only to a process with CAP_NET_ADMIN (Get Connections was refused)")]
    NotTrusted,
    #[error("the management socket did not answer within {} s", PROBE_WAIT.as_secs())]
    NoAnswer,
    #[error("the adapter {0:?} has no controller index (expected hciN)")]
    NoIndex(String),
}

/// The controller index of an adapter named `hciN`.
pub fn index_of(adapter: &str) -> Result<u16, Unavailable> {
    adapter
        .strip_prefix("hci")
        .and_then(|n| n.parse().ok())
        .filter(|i| *i != wire::INDEX_NONE)
        .ok_or_else(|| Unavailable::NoIndex(adapter.to_string()))
}

/// Where frames come from.
#[derive(Debug)]
pub enum Origin {
    /// A socket of the kernel's this process opens.
    Kernel,
    /// A socket of the kernel's opened by the unit's privileged start step and passed
    /// by systemd ([`socket::hand_to_systemd`]).
    Systemd(OwnedFd),
    /// A peer playing the kernel ([`SOCKET_ENV`]).
    Unix(PathBuf),
}

impl Origin {
    /// A peer named by [`SOCKET_ENV`]; else the socket systemd passed; else the
    /// kernel's, opened here.
    pub fn from_env() -> Origin {
        match std::env::var_os(SOCKET_ENV) {
            Some(p) if !p.is_empty() => Origin::Unix(PathBuf::from(p)),
            _ => socket::from_systemd().map_or(Origin::Kernel, Origin::Systemd),
        }
    }
}

/// What reading found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Reads made.
    pub reads: usize,
    /// Reads were left for the next turn (the budget ran out).
    pub more: bool,
    /// The socket closed.
    pub closed: bool,
}

/// A management socket with the reports of one controller.
pub struct Channel {
    socket: socket::Socket,
    frames: Frames,
    buf: Box<[u8]>,
    reports: Reports,
}

impl Channel {
    /// A channel on an open socket (tests give one end of a socket pair).
    pub fn new(fd: OwnedFd, reports: Reports) -> io::Result<Channel> {
        Ok(Channel {
            socket: socket::Socket::new(fd)?,
            frames: Frames::new(),
            buf: vec![0u8; READ_BUF].into_boxed_slice(),
            reports,
        })
    }

    /// Opens the channel from `origin` and checks that the kernel trusts it with
    /// reports.
    pub async fn open(origin: Origin, reports: Reports) -> Result<Channel, Unavailable> {
        let fd = match origin {
            Origin::Kernel => socket::open_kernel(),
            Origin::Systemd(fd) => Ok(fd),
            Origin::Unix(path) => socket::connect_unix(&path),
        }
        .map_err(|e| Unavailable::Socket(e.to_string()))?;
        let mut channel =
            Channel::new(fd, reports).map_err(|e| Unavailable::Socket(e.to_string()))?;
        let index = channel.reports.index;
        let (status, _) = channel
            .call(wire::OP_GET_CONNECTIONS, index, &[], PROBE_WAIT)
            .await?;
        if status == wire::STATUS_PERMISSION_DENIED {
            return Err(Unavailable::NotTrusted);
        }
        Ok(channel)
    }

    pub fn counts(&self) -> Counts {
        self.reports.counts()
    }

    pub fn reports_mut(&mut self) -> &mut Reports {
        &mut self.reports
    }

    /// Waits until there is something to read. Cancel-safe.
    pub async fn readable(&mut self) -> io::Result<()> {
        self.socket.readable().await
    }

    /// Reads will be made on a timer for a while: what arrives meanwhile wakes nobody
    /// (until the next [`readable`](Self::readable)).
    pub fn park(&mut self) {
        self.socket.park();
    }

    /// Reads and handles what is there, at most `budget` reads: adverts go to
    /// `advert` (stamped by `now` once per read), the rest to `control`.
    pub fn drain(
        &mut self,
        budget: usize,
        now: impl Fn() -> EpochMillis,
        mut advert: impl FnMut(Advertisement),
        mut control: impl FnMut(Control),
    ) -> io::Result<Drained> {
        let mut d = Drained::default();
        let Channel {
            socket,
            frames,
            buf,
            reports,
        } = self;
        while d.reads < budget {
            let Some(n) = socket.try_read(buf)? else {
                return Ok(d);
            };
            d.reads += 1;
            if n == 0 {
                d.closed = true;
                return Ok(d);
            }
            let ts = now();
            frames.push(&buf[..n], |f| {
                if let Some(c) = reports.frame(f, ts, &mut advert) {
                    control(c);
                }
            });
        }
        d.more = true;
        Ok(d)
    }

    /// Sends a command to controller `index`.
    pub fn send(&self, opcode: u16, index: u16, params: &[u8]) -> io::Result<()> {
        self.socket.send(&wire::command(opcode, index, params))
    }

    /// Sends a command and waits up to `wait` for its answer (status and return
    /// parameters). Reports read meanwhile are dropped: this is for before the scan.
    pub async fn call(
        &mut self,
        opcode: u16,
        index: u16,
        params: &[u8],
        wait: Duration,
    ) -> Result<(u8, Vec<u8>), Unavailable> {
        self.send(opcode, index, params)
            .map_err(|e| Unavailable::Socket(e.to_string()))?;
        let answer = async {
            loop {
                self.readable()
                    .await
                    .map_err(|e| Unavailable::Socket(e.to_string()))?;
                let mut found = None;
                let d = self
                    .drain(
                        64,
                        || 0,
                        |_| {},
                        |c| {
                            if let Control::CommandDone {
                                opcode: o,
                                status,
                                params,
                            } = c
                            {
                                if o == opcode {
                                    found = Some((status, params));
                                }
                            }
                        },
                    )
                    .map_err(|e| Unavailable::Socket(e.to_string()))?;
                if let Some(f) = found {
                    return Ok(f);
                }
                if d.closed {
                    return Err(Unavailable::Socket("the socket closed".into()));
                }
            }
        };
        tokio::time::timeout(wait, answer)
            .await
            .map_err(|_| Unavailable::NoAnswer)?
    }
}

#[cfg(test)]
mod tests {
    use super::wire::build::*;
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

    #[test]
    fn adapter_names_map_to_controller_indexes() {
        assert_eq!(index_of("hci0"), Ok(0));
        assert_eq!(index_of("hci12"), Ok(12));
        for bad in ["hci", "hcix", "usb0", "hci65535", "hci99999"] {
            assert!(index_of(bad).is_err(), "{bad}");
        }
    }
}
