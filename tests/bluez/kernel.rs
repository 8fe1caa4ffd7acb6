//! The kernel's part of the management socket, played for the daemon without Bluetooth
//! in the kernel: a Unix seqpacket listener that `TAPEGATE_MGMT_SOCKET` points the
//! daemon at, answering its commands as the kernel does (doc/mgmt-api.txt: Command
//! Complete with the status and return parameters) and sending it the frames a test or
//! benchmark writes. One connection at a time; each answer and frame is one message.
#![allow(dead_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tapegate::source::ble::mgmt::wire::{self, build};

/// The answers the fake kernel gives.
#[derive(Debug, Clone, Copy)]
pub struct Answers {
    /// The status of Get Connections (the trust probe): 0, or 0x14 for a process
    /// without CAP_NET_ADMIN.
    pub probe: u8,
    /// The handle Add Advertisement Patterns Monitor returns (status 0), or `None` to
    /// refuse it (Failed).
    pub monitor: Option<u16>,
}

impl Default for Answers {
    fn default() -> Answers {
        Answers {
            probe: wire::STATUS_SUCCESS,
            monitor: Some(1),
        }
    }
}

/// A fake kernel listening at `path`.
pub struct FakeKernel {
    pub path: PathBuf,
    conn: Arc<Mutex<Option<Arc<OwnedFd>>>>,
    commands: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl FakeKernel {
    /// Listens at `dir/mgmt.sock` and answers with `answers` on a thread of its own.
    pub fn start(dir: &Path, answers: Answers) -> FakeKernel {
        let path = dir.join("mgmt.sock");
        let listener = listen(&path);
        let conn: Arc<Mutex<Option<Arc<OwnedFd>>>> = Arc::default();
        let commands: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let (c, cmds) = (conn.clone(), commands.clone());
        std::thread::spawn(move || loop {
            // SAFETY: accept on a listening descriptor owned by this thread.
            let fd = unsafe {
                libc::accept(
                    listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            if fd < 0 {
                return;
            }
            // SAFETY: a new descriptor, owned from here.
            let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
            *c.lock().unwrap() = Some(fd.clone());
            let cmds = cmds.clone();
            std::thread::spawn(move || serve(&fd, answers, &cmds));
        });
        FakeKernel {
            path,
            conn,
            commands,
        }
    }

    /// Waits until the daemon has connected (panics after `limit`).
    pub fn wait_connected(&self, limit: Duration) {
        let connected = crate::common::wait_for(limit, || self.conn.lock().unwrap().clone());
        assert!(
            connected.is_some(),
            "the daemon did not connect to the fake kernel"
        );
    }

    /// Sends one frame to the daemon (blocks while its socket buffer is full).
    pub fn send(&self, frame: &[u8]) {
        let conn = self
            .conn
            .lock()
            .unwrap()
            .clone()
            .expect("the daemon is connected");
        send(&conn, frame);
    }

    /// The command frames received so far.
    pub fn commands(&self) -> Vec<Vec<u8>> {
        self.commands.lock().unwrap().clone()
    }

    /// The opcodes of the commands received so far.
    pub fn opcodes(&self) -> Vec<u16> {
        self.commands()
            .iter()
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }
}

fn serve(fd: &OwnedFd, answers: Answers, commands: &Mutex<Vec<Vec<u8>>>) {
    let mut buf = vec![0u8; 70_000];
    loop {
        // SAFETY: recv into a buffer of the given length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return;
        }
        let frame = buf[..n as usize].to_vec();
        if frame.len() < wire::HEADER_LEN {
            continue;
        }
        let opcode = u16::from_le_bytes([frame[0], frame[1]]);
        let index = u16::from_le_bytes([frame[2], frame[3]]);
        commands.lock().unwrap().push(frame.clone());
        let answer = match opcode {
            wire::OP_GET_CONNECTIONS => {
                build::command_complete(index, opcode, answers.probe, &[0, 0])
            }
            wire::OP_ADD_ADV_PATTERNS_MONITOR => match answers.monitor {
                Some(h) => build::command_complete(index, opcode, 0, &h.to_le_bytes()),
                None => build::command_complete(index, opcode, 0x03, &[]),
            },
            _ => build::command_complete(index, opcode, 0, &frame[wire::HEADER_LEN..]),
        };
        send(fd, &answer);
    }
}

fn send(fd: &OwnedFd, frame: &[u8]) {
    // SAFETY: send from a buffer of the given length.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    assert_eq!(
        n,
        frame.len() as isize,
        "send to the daemon: {}",
        std::io::Error::last_os_error()
    );
}

fn listen(path: &Path) -> OwnedFd {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a zeroed sockaddr_un with a path shorter than its buffer; the descriptor
    // is owned from its creation.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        assert_eq!(
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len
            ),
            0
        );
        assert_eq!(libc::listen(fd.as_raw_fd(), 4), 0);
        fd
    }
}
