//! The thin I/O shell of the side channel: opening the kernel's Bluetooth management
//! control channel (`AF_BLUETOOTH`, `BTPROTO_HCI`, bound to `HCI_DEV_NONE` on
//! `HCI_CHANNEL_CONTROL`, as BlueZ's doc/mgmt-api.txt "Example" does), or for tests and
//! benchmarks a Unix seqpacket socket that plays the kernel's part; and reading and
//! writing whole frames on it without blocking.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

const BTPROTO_HCI: libc::c_int = 1;
const HCI_DEV_NONE: u16 = 0xFFFF;
const HCI_CHANNEL_CONTROL: u16 = 3;

/// `struct sockaddr_hci` of `<bluetooth/hci.h>`.
#[repr(C)]
struct SockaddrHci {
    hci_family: libc::sa_family_t,
    hci_dev: u16,
    hci_channel: u16,
}

/// The kernel's management control channel. Fails with the kernel's reason: no
/// Bluetooth in the kernel (`EAFNOSUPPORT`), a seccomp filter or `RestrictAddressFamilies=`
/// without `AF_BLUETOOTH` (`EAFNOSUPPORT`, `EPERM`), ...
pub fn open_kernel() -> io::Result<OwnedFd> {
    // SAFETY: plain system calls on a descriptor this function owns.
    unsafe {
        let fd = libc::socket(
            libc::AF_BLUETOOTH,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            BTPROTO_HCI,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let addr = SockaddrHci {
            hci_family: libc::AF_BLUETOOTH as libc::sa_family_t,
            hci_dev: HCI_DEV_NONE,
            hci_channel: HCI_CHANNEL_CONTROL,
        };
        let r = libc::bind(
            fd.as_raw_fd(),
            (&addr as *const SockaddrHci).cast(),
            std::mem::size_of::<SockaddrHci>() as libc::socklen_t,
        );
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // The source reads the socket in turns (every 100 ms while reports flow): the
        // kernel drops what does not fit its buffer. 10,000 small reports a second need
        // more than the default (`net.core.rmem_max`, often 208 KiB, counting each
        // report's buffer overhead); a process with CAP_NET_ADMIN may go past it.
        let size: libc::c_int = RECEIVE_BUFFER;
        for option in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            let set = libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            if set == 0 {
                break;
            }
        }
        Ok(fd)
    }
}

/// The receive buffer asked for the management socket.
const RECEIVE_BUFFER: libc::c_int = 4 << 20;

/// A Unix seqpacket socket at `path` whose peer plays the kernel (one frame per
/// message), for tests and benchmarks.
pub fn connect_unix(path: &Path) -> io::Result<OwnedFd> {
    seqpacket(path)
}

fn seqpacket(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: plain system calls on a descriptor this function owns; the address is
    // a zeroed sockaddr_un with a path shorter than its buffer.
    unsafe {
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        if bytes.len() >= addr.sun_path.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "socket path too long",
            ));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let fd = libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let r = libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        );
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// A non-blocking socket of frames. It is registered with the runtime only while the
/// source waits for it: a parked socket (read on a timer while reports flow) wakes
/// nobody when a frame arrives, where a registered one wakes the thread for each.
pub struct Socket {
    /// `Some` while registered.
    registered: Option<AsyncFd<OwnedFd>>,
    /// `Some` while parked.
    parked: Option<OwnedFd>,
}

impl Socket {
    /// Takes `fd` (made non-blocking), parked.
    pub fn new(fd: OwnedFd) -> io::Result<Socket> {
        // SAFETY: fcntl on a descriptor owned by `fd`.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Socket {
            registered: None,
            parked: Some(fd),
        })
    }

    fn raw(&self) -> std::os::fd::RawFd {
        match (&self.registered, &self.parked) {
            (Some(a), _) => a.get_ref().as_raw_fd(),
            (None, Some(fd)) => fd.as_raw_fd(),
            (None, None) => -1,
        }
    }

    /// Stops waking the runtime for what arrives, until the next
    /// [`readable`](Self::readable).
    pub fn park(&mut self) {
        if let Some(a) = self.registered.take() {
            self.parked = Some(a.into_inner());
        }
    }

    /// Waits until a read may find something (registering the socket: what is already
    /// queued makes it ready at once). Cancel-safe.
    pub async fn readable(&mut self) -> io::Result<()> {
        if let Some(fd) = self.parked.take() {
            // SAFETY: `fd` is an open descriptor, owned by the AsyncFd until it is
            // parked again or dropped.
            match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
                Ok(a) => self.registered = Some(a),
                Err(e) => {
                    let (fd, cause) = e.into_parts();
                    self.parked = Some(fd);
                    return Err(cause);
                }
            }
        }
        let Some(a) = &self.registered else {
            return Err(io::Error::other("the socket is gone"));
        };
        let mut guard = a.readable().await?;
        guard.retain_ready();
        Ok(())
    }

    /// Reads what is there into `buf` without waiting: `Ok(Some(n))` bytes (0: the peer
    /// closed), `Ok(None)` nothing now (a registered socket's readiness is cleared, so
    /// that the next [`readable`](Self::readable) waits for more).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut recv = |fd: std::os::fd::RawFd| {
            // SAFETY: recv into a buffer of the given length, on a descriptor owned here.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        };
        let read = match &self.registered {
            Some(a) => a.try_io(Interest::READABLE, |fd| recv(fd.as_raw_fd())),
            None => recv(self.raw()),
        };
        match read {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes one whole frame (a command). Commands are small and rare: a full socket
    /// buffer is an error, not a wait.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: send from a buffer of the given length, on a descriptor owned here.
        let n = unsafe {
            libc::send(
                self.raw(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        // Some kernels answer 0 for a whole management frame sent (habluetooth works
        // around the same): a raw socket takes a frame whole or not at all.
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The name of the management socket in systemd's file descriptor store.
pub const FD_NAME: &str = "tapegate-mgmt";

/// What [`hand_to_systemd`] did.
#[derive(Debug)]
pub enum Handed {
    /// The socket is in the unit's file descriptor store.
    Stored,
    /// Not under systemd (no `NOTIFY_SOCKET`): nothing to hand it to.
    NoManager,
}

/// Opens the kernel's management control channel and puts it into the systemd unit's
/// file descriptor store (`FDSTORE=1`, `FDNAME=tapegate-mgmt`), from which systemd
/// passes it to the daemon. Run as the unit's privileged `ExecStartPre=+` step: the
/// kernel trusts a management socket with advertising reports when the process that
/// binds it has `CAP_NET_ADMIN`, and keeps trusting it in whichever process holds it,
/// so the daemon itself needs neither the capability nor `AF_BLUETOOTH`.
pub fn hand_to_systemd() -> io::Result<Handed> {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return Ok(Handed::NoManager);
    }
    hand_over(&open_kernel()?)?;
    Ok(Handed::Stored)
}

/// Sends `socket` to the service manager named by `NOTIFY_SOCKET` for the unit's file
/// descriptor store, named [`FD_NAME`] (sd-notify's `notify_with_fds`).
pub fn hand_over(socket: &OwnedFd) -> io::Result<()> {
    use sd_notify::NotifyState::{FdName, FdStore};
    use std::os::fd::AsFd;
    sd_notify::notify_with_fds(false, &[FdStore, FdName(FD_NAME)], &[socket.as_fd()])
}

/// The management socket systemd passed from its file descriptor store, if any
/// (`LISTEN_FDS`, `LISTEN_FDNAMES`). The store's copy is removed (`FDSTOREREMOVE=1`):
/// the next start opens a fresh one.
pub fn from_systemd() -> Option<OwnedFd> {
    let fds = sd_notify::listen_fds_with_names(false).ok()?;
    let mut found = None;
    for (fd, name) in fds {
        if name == FD_NAME && found.is_none() {
            // SAFETY: systemd passed this descriptor to this process, named as ours;
            // nothing else here takes it.
            found = Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    if found.is_some() {
        let _ = sd_notify::notify(
            false,
            &[
                sd_notify::NotifyState::FdStoreRemove,
                sd_notify::NotifyState::FdName(FD_NAME),
            ],
        );
    }
    found
}
