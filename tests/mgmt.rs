//! The side channel's reader without hardware: frames built from the layouts of BlueZ's
//! doc/mgmt-api.txt (and the tape advert observed in the field) are written to one end of
//! a Unix socket pair, the reader (`tapegate::source::ble::mgmt::Channel`, the code the
//! `ble` source runs) reads the other end. Seqpacket pairs deliver one frame per read,
//! as the kernel's socket does; stream pairs cut the stream anywhere.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use proptest::prelude::*;
use tapegate::record::{Advertisement, Mac};
use tapegate::source::ble::mgmt::wire::{self, build::*};
use tapegate::source::ble::mgmt::{Channel, Control, Counts, Reports};

const TAPE: [u8; 6] = [0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01];
const PHONE: [u8; 6] = [0x5A, 0x11, 0x22, 0x33, 0x44, 0x55];

/// The tape's advert as observed (DESIGN.md, Products), with flags before it.
fn tape_ad() -> Vec<u8> {
    let mut d = ad(0x01, &[0x06]);
    d.extend(ad(
        0xFF,
        &hex::decode("F70E4956E29F84211E44FFB51E").unwrap(),
    ));
    d
}

/// A seqpacket pair: (the kernel's end, the reader's end).
fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two descriptors that are then owned here.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    use std::os::fd::FromRawFd;
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn send(kernel: &OwnedFd, frame: &[u8]) {
    use std::os::fd::AsRawFd;
    // SAFETY: send from a buffer of the given length.
    let n = unsafe { libc::send(kernel.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(n as usize, frame.len());
}

/// Reads until `want` adverts arrived or nothing came for 200 ms (a deadline for what
/// must not come; everything that does come is read first).
async fn read_all(
    channel: &mut Channel,
    want: usize,
    closes: bool,
) -> (Vec<Advertisement>, Vec<Control>, bool) {
    let (mut adverts, mut controls, mut closed) = (Vec::new(), Vec::new(), false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while (adverts.len() < want || closes) && !closed {
        let wait = if adverts.len() < want {
            deadline
        } else {
            tokio::time::Instant::now() + Duration::from_millis(200)
        };
        if tokio::time::timeout_at(wait, channel.readable())
            .await
            .is_err()
        {
            break;
        }
        let d = channel
            .drain(
                64,
                || 1_763_719_200_000,
                |a| adverts.push(a),
                |c| controls.push(c),
            )
            .unwrap();
        closed = d.closed;
    }
    (adverts, controls, closed)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn frames_over_a_seqpacket_pair_become_the_adverts_the_dbus_path_would_give() {
    runtime().block_on(async {
        let (kernel, reader) = seqpacket_pair();
        let mut channel = Channel::new(reader, Reports::new(0, 64)).unwrap();
        let mut named = tape_ad();
        named.extend(ad(0x09, b"TT-0001"));
        send(&kernel, &device_found(0, TAPE, -61, &named));
        send(&kernel, &monitor_found(0, 0, TAPE, -58, &tape_ad()));
        send(
            &kernel,
            &device_found(0, PHONE, -70, &ad(0xFF, &[0x4C, 0x00, 0x02, 0x15])),
        );
        drop(kernel);
        let (adverts, controls, closed) = read_all(&mut channel, 3, true).await;
        assert!(closed, "the peer closed");
        assert!(controls.is_empty());
        let data = hex::decode("4956E29F84211E44FFB51E").unwrap();
        assert_eq!(
            adverts,
            vec![
                Advertisement {
                    ts_ms: 1_763_719_200_000,
                    mac: Mac::new(TAPE),
                    rssi: Some(-61),
                    name: Some("TT-0001".into()),
                    manufacturer_data: vec![(0x0EF7, data.clone())],
                    service_data: vec![],
                },
                // Each report with its own RSSI; the name heard before completes it.
                Advertisement {
                    ts_ms: 1_763_719_200_000,
                    mac: Mac::new(TAPE),
                    rssi: Some(-58),
                    name: Some("TT-0001".into()),
                    manufacturer_data: vec![(0x0EF7, data)],
                    service_data: vec![],
                },
                Advertisement {
                    ts_ms: 1_763_719_200_000,
                    mac: Mac::new(PHONE),
                    rssi: Some(-70),
                    name: None,
                    manufacturer_data: vec![(0x004C, vec![0x02, 0x15])],
                    service_data: vec![],
                },
            ]
        );
        // The products path gives the tape's capture exactly as from D-Bus.
        let products = tapegate::products::Products(vec![tapegate::products::Product::tape()]);
        let capture = products.capture(&adverts[0]).unwrap();
        assert_eq!(capture.packet, "F70E4956E29F84211E44FFB51E");
        assert!(products.capture(&adverts[2]).is_none());
    });
}

/// Advertising data captured from real devices, as BlueZ's own AD parser is tested with
/// them (bluez/bluez `unit/test-eir.c`: Wahoo Scale, Gigaset G-tag, a URIBeacon, a
/// Citizen watch), each in a Device Found frame of its own.
#[test]
fn captured_adverts_of_real_devices_parse_as_bluez_parses_them() {
    let wahoo_scale: &[u8] = &[
        0x02, 0x01, 0x06, 0x03, 0x02, 0x01, 0x19, 0x11, 0x09, 0x57, 0x61, 0x68, 0x6f, 0x6f, 0x20,
        0x53, 0x63, 0x61, 0x6c, 0x65, 0x20, 0x76, 0x31, 0x2e, 0x33, 0x05, 0xff, 0x00, 0x00, 0x00,
        0x9c,
    ];
    let gigaset_gtag: &[u8] = &[
        0x02, 0x01, 0x06, 0x0d, 0xff, 0x80, 0x01, 0x02, 0x15, 0x12, 0x34, 0x80, 0x91, 0xd0, 0xf2,
        0xbb, 0xc5, 0x03, 0x02, 0x0f, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    let uri_beacon: &[u8] = &[
        0x03, 0x03, 0xd8, 0xfe, 0x0c, 0x16, 0xd8, 0xfe, 0x00, 0x20, 0x00, b'b', b'l', b'u', b'e',
        b'z', 0x08,
    ];
    let citizen: &[u8] = &[
        0x02, 0x01, 0x05, 0x05, 0x12, 0x7f, 0x01, 0x8f, 0x01, 0x14, 0x09, 0x45, 0x63, 0x6f, 0x2d,
        0x44, 0x72, 0x69, 0x76, 0x65, 0x20, 0x50, 0x72, 0x6f, 0x78, 0x69, 0x6d, 0x69, 0x74, 0x79,
    ];
    runtime().block_on(async {
        let (kernel, reader) = seqpacket_pair();
        let mut channel = Channel::new(reader, Reports::new(0, 64)).unwrap();
        for (i, data) in [wahoo_scale, gigaset_gtag, uri_beacon, citizen]
            .iter()
            .enumerate()
        {
            send(
                &kernel,
                &device_found(0, [0xC0, 0, 0, 0, 0, i as u8], -50, data),
            );
        }
        let (a, _, _) = read_all(&mut channel, 4, false).await;
        assert_eq!(a.len(), 4);
        assert_eq!(a[0].name.as_deref(), Some("Wahoo Scale v1.3"));
        assert_eq!(a[0].manufacturer_data, vec![(0x0000, vec![0x00, 0x9c])]);
        assert_eq!(a[1].name, None);
        assert_eq!(
            a[1].manufacturer_data,
            vec![(
                0x0180,
                vec![0x02, 0x15, 0x12, 0x34, 0x80, 0x91, 0xd0, 0xf2, 0xbb, 0xc5]
            )]
        );
        assert_eq!(
            a[2].service_data,
            vec![(
                "0000fed8-0000-1000-8000-00805f9b34fb".to_string(),
                vec![0x00, 0x20, 0x00, b'b', b'l', b'u', b'e', b'z', 0x08]
            )]
        );
        assert_eq!(a[3].name.as_deref(), Some("Eco-Drive Proximity"));
        assert!(a[3].manufacturer_data.is_empty() && a[3].service_data.is_empty());
        assert_eq!(channel.counts().truncated, 0);
    });
}

/// Names as BlueZ keeps them (src/eir.c, src/adapter.c): the NUL bytes some vendors end
/// a name with are not part of it, and a complete name once heard is not replaced by a
/// shortened one (the `Name` property the D-Bus path reads).
#[test]
fn names_lose_their_trailing_nuls_and_a_complete_name_outlives_a_shortened_one() {
    runtime().block_on(async {
        let (kernel, reader) = seqpacket_pair();
        let mut channel = Channel::new(reader, Reports::new(0, 64)).unwrap();
        let named = |ad_type: u8, name: &[u8]| {
            let mut d = tape_ad();
            d.extend(ad(ad_type, name));
            d
        };
        for data in [named(0x09, b"TT-0001\0\0"), named(0x08, b"TT"), tape_ad()] {
            send(&kernel, &device_found(0, TAPE, -60, &data));
        }
        for data in [
            named(0x08, b"PH"),
            named(0x09, b"PHONE-1\0"),
            named(0x08, b"PH"),
        ] {
            send(&kernel, &device_found(0, PHONE, -70, &data));
        }
        let (adverts, _, _) = read_all(&mut channel, 6, false).await;
        let names: Vec<(Mac, Option<&str>)> =
            adverts.iter().map(|a| (a.mac, a.name.as_deref())).collect();
        assert_eq!(
            names,
            vec![
                (Mac::new(TAPE), Some("TT-0001")),
                (Mac::new(TAPE), Some("TT-0001")),
                (Mac::new(TAPE), Some("TT-0001")),
                (Mac::new(PHONE), Some("PH")),
                (Mac::new(PHONE), Some("PHONE-1")),
                (Mac::new(PHONE), Some("PHONE-1")),
            ]
        );
    });
}

#[test]
fn bad_frames_other_adapters_and_unknown_events_are_counted_and_skipped() {
    runtime().block_on(async {
        let (kernel, reader) = seqpacket_pair();
        let mut channel = Channel::new(reader, Reports::new(1, 64)).unwrap();
        // Short: a Device Found with 5 bytes of parameters.
        send(&kernel, &frame(wire::EV_DEVICE_FOUND, 1, &[1, 2, 3, 4, 5]));
        // The data length says more than follows.
        let mut p = found_params(TAPE, 2, -60, &tape_ad());
        p.truncate(p.len() - 3);
        send(&kernel, &frame(wire::EV_DEVICE_FOUND, 1, &p));
        // Another adapter's report; unknown events; a classic device.
        send(&kernel, &device_found(0, TAPE, -60, &tape_ad()));
        send(&kernel, &frame(0x0042, 1, &[0xAA; 20]));
        send(&kernel, &frame(0x0013, 1, &[6, 1]));
        send(
            &kernel,
            &frame(wire::EV_DEVICE_FOUND, 1, &found_params(PHONE, 0, -40, &[])),
        );
        // A truncated AD structure: the manufacturer data before it is kept.
        let mut truncated = tape_ad();
        truncated.extend([12, 0x09, b'T', b'T']);
        send(&kernel, &device_found(1, TAPE, -62, &truncated));
        // A 255-byte extended report.
        let body: Vec<u8> = [0xF7, 0x0E].into_iter().chain(0..251).collect();
        send(&kernel, &device_found(1, TAPE, -63, &ad(0xFF, &body)));
        // And a good report after all of it.
        send(&kernel, &device_found(1, TAPE, -64, &tape_ad()));
        let (adverts, controls, _) = read_all(&mut channel, 3, false).await;
        assert!(controls.is_empty(), "{controls:?}");
        let rssi: Vec<_> = adverts.iter().map(|a| a.rssi).collect();
        assert_eq!(rssi, vec![Some(-62), Some(-63), Some(-64)]);
        assert_eq!(adverts[0].manufacturer_data, adverts[2].manufacturer_data);
        assert_eq!(adverts[1].manufacturer_data[0].1.len(), 251);
        assert_eq!(
            channel.counts(),
            Counts {
                reports: 3,
                malformed: 2,
                truncated: 1,
                other_adapters: 1,
                classic: 1,
            }
        );
    });
}

#[test]
fn a_stream_cut_into_odd_pieces_gives_every_frame_whole() {
    runtime().block_on(async {
        let (mut kernel, reader) = UnixStream::pair().unwrap();
        let mut channel = Channel::new(OwnedFd::from(reader), Reports::new(0, 64)).unwrap();
        let mut stream = Vec::new();
        for i in 0..50u8 {
            let mut d = ad(0x01, &[0x06]);
            d.extend(ad(0xFF, &[0xF7, 0x0E, 0x49, 0x56, i]));
            stream.extend(device_found(0, TAPE, -(i as i8), &d));
            stream.extend(command_complete(0, 0x0099, 0, &[i]));
        }
        let writer = std::thread::spawn(move || {
            for piece in stream.chunks(7) {
                kernel.write_all(piece).unwrap();
                kernel.flush().unwrap();
            }
        });
        let (adverts, controls, _) = read_all(&mut channel, 50, true).await;
        writer.join().unwrap();
        let counters: Vec<u8> = adverts
            .iter()
            .map(|a| *a.manufacturer_data[0].1.last().unwrap())
            .collect();
        assert_eq!(counters, (0..50).collect::<Vec<u8>>());
        assert_eq!(controls.len(), 50);
        assert_eq!(channel.counts().malformed, 0);
    });
}

#[test]
fn the_trust_probe_tells_a_socket_without_cap_net_admin_from_a_trusted_one() {
    use tapegate::source::ble::mgmt::{Origin, Unavailable};
    runtime().block_on(async {
        for (status, trusted) in [
            (wire::STATUS_PERMISSION_DENIED, false),
            (0x00, true),
            (0x0F, true),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("mgmt.sock");
            let listener = seqpacket_listener(&path);
            let peer = std::thread::spawn(move || {
                let conn = accept(&listener);
                let mut buf = [0u8; 64];
                use std::os::fd::AsRawFd;
                // SAFETY: recv into a buffer of the given length.
                let n = unsafe { libc::recv(conn.as_raw_fd(), buf.as_mut_ptr().cast(), 64, 0) };
                assert_eq!(
                    &buf[..n as usize],
                    &wire::command(wire::OP_GET_CONNECTIONS, 3, &[])
                );
                // A report before the answer is not taken for it.
                send(&conn, &device_found(3, TAPE, -60, &tape_ad()));
                send(
                    &conn,
                    &command_complete(3, wire::OP_GET_CONNECTIONS, status, &[0, 0]),
                );
                conn
            });
            let opened = Channel::open(Origin::Unix(path), Reports::new(3, 16)).await;
            let _conn = peer.join().unwrap();
            match (trusted, opened) {
                (true, Ok(_)) => {}
                (false, Err(Unavailable::NotTrusted)) => {}
                (t, r) => panic!("status {status:#x}: trusted {t}, got {:?}", r.err()),
            }
        }
        // Nobody there: the reason is the kernel's.
        let e = Channel::open(
            Origin::Unix("/nonexistent/mgmt.sock".into()),
            Reports::new(0, 16),
        )
        .await
        .err()
        .unwrap();
        assert!(matches!(e, Unavailable::Socket(_)), "{e}");
    });
}

#[test]
fn the_units_start_step_hands_the_socket_to_systemds_store_by_name() {
    use std::os::fd::{AsRawFd, FromRawFd};
    use tapegate::source::ble::mgmt::socket::{hand_over, FD_NAME};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    // The service manager's end.
    let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let (kernel, socket) = seqpacket_pair();
    // The start step finds the manager where systemd says it is; no other test of this
    // file reads the variable.
    std::env::set_var("NOTIFY_SOCKET", &path);
    hand_over(&socket).unwrap();
    drop(socket);
    // What systemd reads: the state, and one descriptor with it.
    let mut data = [0u8; 256];
    let mut control = [0u8; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: recvmsg into live buffers of the given sizes; the descriptor received is
    // owned from here.
    let (n, fd) = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() as _;
        let n = libc::recvmsg(manager.as_raw_fd(), &mut msg, 0);
        assert!(n > 0, "{}", std::io::Error::last_os_error());
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        assert!(!cmsg.is_null(), "no descriptor came with the state");
        assert_eq!(
            ((*cmsg).cmsg_level, (*cmsg).cmsg_type),
            (libc::SOL_SOCKET, libc::SCM_RIGHTS)
        );
        let fd: libc::c_int = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
        (n as usize, OwnedFd::from_raw_fd(fd))
    };
    assert_eq!(
        std::str::from_utf8(&data[..n]).unwrap(),
        format!("FDSTORE=1\nFDNAME={FD_NAME}\n")
    );
    // The descriptor received is the socket itself: what the kernel sends arrives there.
    send(&kernel, &device_found(0, TAPE, -60, &tape_ad()));
    runtime().block_on(async {
        let mut channel = Channel::new(fd, Reports::new(0, 16)).unwrap();
        let (adverts, _, _) = read_all(&mut channel, 1, false).await;
        assert_eq!(adverts.len(), 1);
    });
}

fn seqpacket_listener(path: &std::path::Path) -> OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a zeroed sockaddr_un with a short path; descriptors owned here.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
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

fn accept(listener: &OwnedFd) -> OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: accept on a listening descriptor; the new one is owned here.
    unsafe {
        let fd = libc::accept(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert!(fd >= 0);
        OwnedFd::from_raw_fd(fd)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever bytes arrive, cut however, the reader never panics, and every frame
    /// that decodes as a report of the controller becomes exactly one advert.
    #[test]
    fn arbitrary_bytes_never_panic(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..12),
    ) {
        let mut reports = Reports::new(0, 8);
        let mut frames = wire::Frames::new();
        let mut adverts = 0u64;
        for c in &chunks {
            frames.push(c, |f| {
                reports.frame(f, 0, &mut |_| adverts += 1);
            });
        }
        prop_assert_eq!(adverts, reports.counts().reports);
    }

    /// Arbitrary parameters under a report's code: a report or a counted malformed
    /// frame, never a panic; and arbitrary advertising data inside a well-formed report
    /// always gives the report.
    #[test]
    fn arbitrary_report_parameters_and_data_never_panic(
        params in proptest::collection::vec(any::<u8>(), 0..400),
        data in proptest::collection::vec(any::<u8>(), 0..300),
        monitor in any::<bool>(),
    ) {
        let code = if monitor { wire::EV_ADV_MONITOR_DEVICE_FOUND } else { wire::EV_DEVICE_FOUND };
        let mut reports = Reports::new(0, 8);
        let mut stream = frame(code, 0, &params);
        stream.extend(device_found(0, TAPE, -50, &data));
        let mut n = 0;
        wire::Frames::new().push(&stream, |f| {
            reports.frame(f, 0, &mut |_| n += 1);
        });
        let c = reports.counts();
        prop_assert!(n >= 1, "the well-formed report was lost");
        prop_assert_eq!(n as u64, c.reports);
        prop_assert_eq!(c.reports + c.malformed + c.classic, 2);
    }
}
