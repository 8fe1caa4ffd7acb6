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
        Ok(fd)
    }
}

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

/// A non-blocking socket of frames, registered with the runtime.
pub struct Socket {
    fd: AsyncFd<OwnedFd>,
}

impl Socket {
    /// Registers `fd` (made non-blocking) with the runtime.
    pub fn new(fd: OwnedFd) -> io::Result<Socket> {
        // SAFETY: fcntl on a descriptor owned by `fd`.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: `fd` is an open descriptor, owned by the AsyncFd from here until it
        // is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Socket { fd })
    }

    /// Waits until a read may find something. Cancel-safe.
    pub async fn readable(&self) -> io::Result<()> {
        let mut guard = self.fd.readable().await?;
        guard.retain_ready();
        Ok(())
    }

    /// Reads what is there into `buf` without waiting: `Ok(Some(n))` bytes (0: the peer
    /// closed), `Ok(None)` nothing now (the readiness is cleared, so that the next
    /// [`readable`](Self::readable) waits for more).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let read = self.fd.try_io(Interest::READABLE, |fd| {
            // SAFETY: recv into a buffer of the given length, on a descriptor owned here.
            let n = unsafe {
                libc::recv(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
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
                self.fd.get_ref().as_raw_fd(),
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
