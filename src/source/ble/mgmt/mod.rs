/*!
The side channel: advertising reports read from the kernel's Bluetooth management socket
beside bluetoothd, as Home Assistant's `habluetooth` does (its
`channels/bluez.py` reader), instead of one D-Bus signal per advert through
dbus-daemon. bluetoothd keeps owning the adapter: the `ble` source still starts and
keeps discovery alive over D-Bus; the kernel sends every management socket a copy of
each report (`Device Found`, and `Advertisement Monitor Device Found` while a monitor
scans passively), with its own RSSI and the raw advertising data.
It touches the kernel's socket and the records. Frames and events and the advertising
data's AD structures are decoded purely (the layouts of BlueZ's doc/mgmt-api.txt);
[`Reports`] turns frames into [`Advertisement`]s for one controller; [`Channel`], here,
joins it to a socket (opened, read and written in a room of its own) and waits for the
answers to commands.

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

use crate::record::{Advertisement, EpochMillis};

pub mod ad;
mod reports;
pub mod socket;
pub mod wire;

pub use reports::{Control, Counts, Reports};
use wire::Frames;

/// Set to a Unix seqpacket socket's path, a debug build reads management frames from
/// the peer listening there instead of the kernel (tests and benchmarks; logged at WARN).
pub const SOCKET_ENV: &str = crate::util::debug_hooks::MGMT_SOCKET_ENV;

/// How long opening waits for the kernel's answer to the trust probe.
const PROBE_WAIT: Duration = Duration::from_secs(2);
/// The largest frame: header and 65535 bytes of parameters.
const READ_BUF: usize = wire::HEADER_LEN + 65535;

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
    /// A peer playing the kernel (a debug build's test hook).
    Unix(PathBuf),
}

impl Origin {
    /// `peer`, a debug build's stand-in for the kernel
    /// ([`crate::util::debug_hooks::DebugHooks::mgmt_socket`]); else `stored`, the socket the
    /// unit's start step stored (which the daemon took from systemd:
    /// [`socket::from_systemd`]); else the kernel's, opened here.
    pub fn choose(peer: Option<PathBuf>, stored: Option<OwnedFd>) -> Origin {
        match peer {
            Some(p) => Origin::Unix(p),
            None => stored.map_or(Origin::Kernel, Origin::Systemd),
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
        // Nothing scans yet: what comes before the answer is of no use.
        let (status, _) = channel
            .call(
                wire::OP_GET_CONNECTIONS,
                index,
                &[],
                PROBE_WAIT,
                &|| 0,
                &mut Meanwhile::default(),
            )
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
    /// parameters). What else is read meanwhile (reports, stamped by `now`, and other
    /// events) is kept in `meanwhile` for the caller.
    pub async fn call(
        &mut self,
        opcode: u16,
        index: u16,
        params: &[u8],
        wait: Duration,
        now: &(dyn Fn() -> EpochMillis + Sync),
        meanwhile: &mut Meanwhile,
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
                        now,
                        |a| meanwhile.adverts.push(a),
                        |c| match c {
                            Control::CommandDone {
                                opcode: o,
                                status,
                                params,
                            } if o == opcode && found.is_none() => found = Some((status, params)),
                            c => meanwhile.controls.push(c),
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

/// What a channel read while it waited for an answer ([`Channel::call`]), for the
/// caller to handle after.
#[derive(Debug, Default)]
pub struct Meanwhile {
    pub adverts: Vec<Advertisement>,
    pub controls: Vec<Control>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_names_map_to_controller_indexes() {
        assert_eq!(index_of("hci0"), Ok(0));
        assert_eq!(index_of("hci12"), Ok(12));
        for bad in ["hci", "hcix", "usb0", "hci65535", "hci99999"] {
            assert!(index_of(bad).is_err(), "{bad}");
        }
    }
}
