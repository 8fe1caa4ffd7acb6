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

/// Set Powered, Read Advertisement Monitor Features and the Busy status, as
/// doc/mgmt-api.txt numbers them (written here again, not taken from the code under
/// test).
pub const OP_SET_POWERED: u16 = 0x0005;
pub const OP_READ_ADV_MONITOR_FEATURES: u16 = 0x0051;
pub const STATUS_BUSY: u8 = 0x0a;

/// The answers the fake kernel gives.
#[derive(Debug, Clone, Copy)]
pub struct Answers {
    /// The status of Get Connections (the trust probe): 0, or 0x14 for a process
    /// without CAP_NET_ADMIN.
    pub probe: u8,
    /// The handle Add Advertisement Patterns Monitor returns (status 0), or `None` to
    /// refuse it (Failed).
    pub monitor: Option<u16>,
    /// Remove Advertisement Monitor is answered this long after it came, and an Add
    /// that comes meanwhile is answered Busy, as the kernel does while a monitor
    /// command is pending.
    pub remove_takes: Duration,
    /// Every Add is answered Busy until the adapter is powered off and on again (a
    /// kernel left with a command pending for good).
    pub busy_until_power_cycle: bool,
}

impl Default for Answers {
    fn default() -> Answers {
        Answers {
            probe: wire::STATUS_SUCCESS,
            monitor: Some(1),
            remove_takes: Duration::ZERO,
            busy_until_power_cycle: false,
        }
    }
}

/// What the fake kernel holds between commands.
#[derive(Debug, Default)]
pub struct KernelState {
    /// The monitors added and not removed.
    pub monitors: Vec<u16>,
    /// A Remove is pending.
    removing: bool,
    /// Adds are answered Busy until a power cycle.
    busy: bool,
    /// The adapter was powered off since `busy` was set.
    powered_off: bool,
}

/// A fake kernel listening at `path`.
pub struct FakeKernel {
    pub path: PathBuf,
    conn: Arc<Mutex<Option<Arc<OwnedFd>>>>,
    commands: Arc<Mutex<Vec<Vec<u8>>>>,
    pub state: Arc<Mutex<KernelState>>,
}

impl FakeKernel {
    /// Listens at `dir/mgmt.sock` and answers with `answers` on a thread of its own.
    pub fn start(dir: &Path, answers: Answers) -> FakeKernel {
        let path = dir.join("mgmt.sock");
        let listener = listen(&path);
        let conn: Arc<Mutex<Option<Arc<OwnedFd>>>> = Arc::default();
        let commands: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let state = Arc::new(Mutex::new(KernelState {
            busy: answers.busy_until_power_cycle,
            ..KernelState::default()
        }));
        let (c, cmds, st) = (conn.clone(), commands.clone(), state.clone());
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
            let (cmds, st) = (cmds.clone(), st.clone());
            std::thread::spawn(move || serve(&fd, answers, &cmds, &st));
        });
        FakeKernel {
            path,
            conn,
            commands,
            state,
        }
    }

    /// Waits until the daemon has connected (panics after `limit`).
    pub fn wait_connected(&self, limit: Duration) {
        let connected = crate::common::eventually(limit, || self.conn.lock().unwrap().clone());
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

    /// The commands received so far with `opcode`.
    pub fn commands_of(&self, opcode: u16) -> Vec<Vec<u8>> {
        self.commands()
            .into_iter()
            .filter(|c| c[..2] == opcode.to_le_bytes())
            .collect()
    }

    /// The opcodes of the commands received so far.
    pub fn opcodes(&self) -> Vec<u16> {
        self.commands()
            .iter()
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }
}

fn serve(
    fd: &Arc<OwnedFd>,
    answers: Answers,
    commands: &Mutex<Vec<Vec<u8>>>,
    state: &Arc<Mutex<KernelState>>,
) {
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
        let params = &frame[wire::HEADER_LEN..];
        commands.lock().unwrap().push(frame.clone());
        let done = |status: u8, ret: &[u8]| build::command_complete(index, opcode, status, ret);
        let mut st = state.lock().unwrap();
        let answer = match opcode {
            wire::OP_GET_CONNECTIONS => done(answers.probe, &[0, 0]),
            wire::OP_ADD_ADV_PATTERNS_MONITOR if st.removing || st.busy => done(STATUS_BUSY, &[]),
            wire::OP_ADD_ADV_PATTERNS_MONITOR => match answers.monitor {
                Some(h) => {
                    if !st.monitors.contains(&h) {
                        st.monitors.push(h);
                    }
                    done(0, &h.to_le_bytes())
                }
                None => done(0x03, &[]),
            },
            wire::OP_REMOVE_ADV_MONITOR => {
                let h = u16::from_le_bytes([params[0], params[1]]);
                st.monitors.retain(|m| h != 0 && *m != h);
                let answer = done(0, params);
                if answers.remove_takes > Duration::ZERO {
                    st.removing = true;
                    let (fd, state) = (fd.clone(), state.clone());
                    let takes = answers.remove_takes;
                    std::thread::spawn(move || {
                        std::thread::sleep(takes);
                        state.lock().unwrap().removing = false;
                        send(&fd, &answer);
                    });
                    continue;
                }
                answer
            }
            OP_READ_ADV_MONITOR_FEATURES => {
                let mut ret = vec![0u8; 8];
                ret.extend(32u16.to_le_bytes());
                ret.push(16);
                ret.extend((st.monitors.len() as u16).to_le_bytes());
                for h in &st.monitors {
                    ret.extend(h.to_le_bytes());
                }
                done(0, &ret)
            }
            OP_SET_POWERED => {
                match params.first() {
                    Some(0) => st.powered_off = true,
                    _ if st.powered_off => {
                        st.busy = false;
                        st.powered_off = false;
                    }
                    _ => {}
                }
                done(0, &[0, 0, 0, 0])
            }
            _ => done(0, params),
        };
        drop(st);
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
