//! Unmodified rdma-core programs over libsoftiwarp with no configuration: with
//! `SOFTIWARP_DEVICE` unset the library makes one host-TCP device per interface that is
//! up with an IPv4 address (`siw_lo`, `siw_eth0`, ...), so programs meet on the host's
//! own addresses and kernel TCP ports, as with kernel siw. Each program runs as
//! `nobody` (through runuser when the tests run as root), in its own process group,
//! with a deadline; servers are waited for in `/proc/net/tcp`, not by sleeping.
//!
//! rping (wildcard server, client by address and by host name; a persistent server
//! with three clients at once), perftest with `-R`, ucmatose, a C program with a TCP
//! side channel to the address it resolves (`tests/sidechannel.c`), and `ibv_devices`.

mod support;

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{
    build_c, c_toolchain, check_pings, free_port, host_rping, host_server as server, perftest_pair,
    quiet, require, spawn_with, LibDir, Mode, Outcome, PerftestEnd, Proc,
};

/// `rping -s -a 0.0.0.0 -C 100 -V` and `rping -c -a dst -C 100 -V -v` on a free port,
/// both with no device line ([`host_rping`]).
fn rping_to(dst: &str, tag: &str) {
    host_rping(tag, dst, 100, &[]);
}

#[test]
fn rping_with_no_device_line_meets_a_wildcard_server_on_127_0_0_1() {
    if !require("rping") {
        return;
    }
    rping_to("127.0.0.1", "host-rping");
}

#[test]
fn rping_with_no_device_line_reaches_the_server_by_the_host_name() {
    if !require("rping") || !require("hostname") {
        return;
    }
    let out = Command::new("hostname").output().expect("hostname");
    let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // rping takes getaddrinfo's first answer.
    let first = (name.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip());
    let held: Vec<Ipv4Addr> = sw::host::netdev::interfaces()
        .expect("the interfaces")
        .iter()
        .filter(|i| i.up)
        .flat_map(|i| i.addrs.iter().map(|s| s.addr))
        .collect();
    match first {
        Some(IpAddr::V4(ip)) if held.contains(&ip) => {
            eprintln!("host name {name} is {ip}");
            rping_to(&name, "host-rping-name");
        }
        other => eprintln!(
            "skipping: host name {name:?} resolves to {other:?}, which no interface that is up holds ({held:?})"
        ),
    }
}

#[test]
fn perftest_rdma_cm_with_no_device_line_on_127_0_0_1() {
    let progs = [
        ("ib_write_bw", 65536, 5000),
        ("ib_read_bw", 65536, 1000),
        ("ib_send_lat", 2, 1000),
    ];
    if !progs.iter().all(|(p, _, _)| require(p)) {
        return;
    }
    let lib = LibDir::new("host-perftest");
    for (prog, size, iters) in progs {
        for attempt in 1..=3 {
            let port = free_port().to_string();
            let server = PerftestEnd {
                device: None,
                args: &["-p", &port],
            };
            let client = PerftestEnd {
                device: None,
                args: &["-p", &port, "127.0.0.1"],
            };
            if perftest_pair(&lib, prog, server, client, (size, iters), attempt < 3).is_some() {
                break;
            }
        }
    }
}

/// ucmatose's server sends first, which plain MPA forbids until the initiator's first
/// FPDU (RFC 5044 7.1.2; the library's default, as kernel siw's): the client asks for
/// peer-to-peer mode (`netdev=lo,p2p=on`), whose RTR is that FPDU. The server has no
/// device line: its devices take peer-to-peer mode when offered.
#[test]
fn ucmatose_server_with_no_device_line_serves_a_p2p_client_on_127_0_0_1() {
    if !require("ucmatose") {
        return;
    }
    let lib = LibDir::new("host-ucmatose");
    let port = free_port();
    let p = port.to_string();
    let srv = server(&lib, "ucmatose", &["-p", &p], port);
    let cli = spawn_with(
        &lib,
        Mode::Preload,
        Some("netdev=lo,p2p=on"),
        "ucmatose",
        &["-s", "127.0.0.1", "-p", &p],
    );
    let c = cli.wait(Duration::from_secs(60));
    let s = srv.wait(Duration::from_secs(20));
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(o.ok(), "{who}: {o:?}");
        assert!(o.stdout.contains("data transfers complete"), "{who}: {o:?}");
        assert!(o.stdout.contains("return status 0"), "{who}: {o:?}");
        quiet(o, who);
    }
}

#[test]
fn a_persistent_rping_server_serves_three_clients_at_once() {
    if !require("rping") {
        return;
    }
    let lib = LibDir::new("host-rping-persistent");
    let port = free_port();
    let p = port.to_string();
    let mut srv = server(
        &lib,
        "rping",
        &["-s", "-P", "-a", "0.0.0.0", "-p", &p],
        port,
    );
    let clients: Vec<Proc> = (0..3)
        .map(|_| {
            spawn_with(
                &lib,
                Mode::Preload,
                None,
                "rping",
                &["-c", "-a", "127.0.0.1", "-p", &p, "-C", "20", "-V", "-v"],
            )
        })
        .collect();
    let outcomes: Vec<Outcome> = clients
        .into_iter()
        .map(|c| c.wait(Duration::from_secs(90)))
        .collect();
    // A persistent server never ends by itself: it must still be up, then is killed.
    assert!(
        srv.child.try_wait().unwrap().is_none(),
        "the persistent server ended"
    );
    srv.kill();
    let s = srv.wait(Duration::from_secs(10));
    for (i, c) in outcomes.iter().enumerate() {
        let who = format!("client {i}");
        assert!(c.ok(), "{who}: {c:?}");
        check_pings(&c.stdout, "ping data: ", 20, &who);
        quiet(c, &who);
    }
    quiet(&s, "server");
}

#[test]
fn an_rdma_program_with_a_tcp_side_channel_to_the_address_it_resolves() {
    let Some(cc) = c_toolchain() else { return };
    let lib = LibDir::new("host-sidechannel");
    let bin = build_c(&lib, cc, "sidechannel", &[]);
    let bin = bin.to_str().unwrap();
    let (rdma, tcp) = (free_port(), free_port());
    let (r, t) = (rdma.to_string(), tcp.to_string());
    // The server on the wildcard address (its RDMA listener spans every device), the
    // client to 127.0.0.1 for both connections.
    let srv = server(&lib, bin, &["server", "0.0.0.0", &r, &t], rdma);
    let cli = spawn_with(
        &lib,
        Mode::Preload,
        None,
        bin,
        &["client", "127.0.0.1", &r, &t],
    );
    let c = cli.wait(Duration::from_secs(60));
    let s = srv.wait(Duration::from_secs(20));
    assert!(c.ok(), "client: {c:?}");
    assert!(s.ok(), "server: {s:?}");
    assert!(s.stdout.contains("verified 65536 bytes"), "{s:?}");
    for (who, o) in [("client", &c), ("server", &s)] {
        // The CM put both ends on lo's device (id->verbs), whose GID is not zero.
        assert!(o.stdout.contains("device: siw_lo gid "), "{who}: {o:?}");
        assert!(!o.stdout.contains("gid 00:00:00:00:00:00"), "{who}: {o:?}");
        assert!(o.stdout.ends_with("ok\n"), "{who}: {o:?}");
        quiet(o, who);
    }
}

#[test]
fn ibv_devices_lists_a_device_per_interface_and_a_netdev_line_only_its_own() {
    if !require("ibv_devices") || !require("ibv_devinfo") {
        return;
    }
    let lib = LibDir::new("host-devices");
    let names = |o: &Outcome| -> Vec<String> {
        o.stdout
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    };
    let o = spawn_with(&lib, Mode::Preload, None, "ibv_devices", &[]).wait(Duration::from_secs(30));
    assert!(o.ok(), "{o:?}");
    quiet(&o, "ibv_devices");
    let want: Vec<String> = sw::host::netdev::interfaces()
        .expect("the interfaces")
        .iter()
        .filter(|i| i.up && !i.addrs.is_empty())
        .map(|i| format!("siw_{}", i.name))
        .collect();
    assert!(want.contains(&"siw_lo".to_owned()), "{want:?}");
    assert_eq!(names(&o), want, "{}", o.stdout);

    let o = spawn_with(&lib, Mode::Preload, Some("netdev=lo"), "ibv_devices", &[])
        .wait(Duration::from_secs(30));
    assert!(o.ok(), "{o:?}");
    assert_eq!(names(&o), ["siw_lo"], "{}", o.stdout);

    // lo's device: an iWARP device, its port up (its GID: the side-channel test).
    let o = spawn_with(&lib, Mode::Preload, Some("netdev=lo"), "ibv_devinfo", &[])
        .wait(Duration::from_secs(30));
    assert!(o.ok(), "{o:?}");
    assert!(o.stdout.contains("hca_id:\tsiw_lo"), "{}", o.stdout);
    assert!(
        o.stdout.contains("transport:\t\t\tiWARP (1)"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("PORT_ACTIVE (4)"), "{}", o.stdout);

    // A netdev line with a key of a link of our own: no device, one line naming it.
    let o = spawn_with(
        &lib,
        Mode::Preload,
        Some("netdev=lo,ip=10.0.0.1/24"),
        "ibv_devinfo",
        &[],
    )
    .wait(Duration::from_secs(30));
    assert!(o.exited().is_some_and(|c| c != 0), "{o:?}");
    assert!(
        o.stderr
            .contains("libsoftiwarp: SOFTIWARP_DEVICE: ip: not with netdev=lo"),
        "{}",
        o.stderr
    );
}

/// `prog args` under the library in namespace `ns` with `SOFTIWARP_DEVICE=device` (root:
/// `ip netns exec`), in its own process group; its stdout goes to `out` (a file, so a
/// chatty program never blocks on a full pipe while the test waits), its stderr to a pipe.
fn spawn_in_netns(
    lib: &LibDir,
    ns: &str,
    device: &str,
    prog: &str,
    args: &[&str],
    out: &Path,
) -> Proc {
    use std::os::unix::process::CommandExt;
    let (k, v) = lib.env(Mode::Preload);
    let stdout = std::fs::File::create(out).expect("stdout file");
    let child = Command::new("ip")
        .args(["netns", "exec", ns, "env"])
        .arg(format!("{k}={v}"))
        .arg(format!("SOFTIWARP_DEVICE={device}"))
        .arg(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    Proc::new(child, format!("{prog} {} (in {ns})", args.join(" ")))
}

/// Root: two namespaces joined by one veth, an unmodified rping server and client
/// pinging under the library on host-TCP devices bound to the veth's ends
/// (`netdev=`); `ip link del` of the veth removes both devices: each rping hears
/// `DEVICE_REMOVAL` ("cma detected device removal") and exits within 1 s of the
/// deletion, with an error, no ping after it.
#[test]
fn unmodified_rping_hears_device_removal_when_its_veth_is_deleted() {
    use netlab::Side;
    if !netlab::netns::is_root() {
        eprintln!("skipped: namespaces and a veth need root");
        return;
    }
    if !require("rping") {
        return;
    }
    let lib = LibDir::new("veth-removal");
    let pair = netlab::VethPair::create(1500).expect("two namespaces and a veth");
    let (ns_a, ns_b) = (
        pair.netns(Side::A).name().to_owned(),
        pair.netns(Side::B).name().to_owned(),
    );
    let server_ip = pair.ip(Side::B).to_string();
    let port = free_port().to_string();
    let (s_out, c_out) = (lib.dir.join("rping-s.out"), lib.dir.join("rping-c.out"));
    let server = spawn_in_netns(
        &lib,
        &ns_b,
        &format!("netdev={}", pair.veth(Side::B)),
        "rping",
        &["-s", "-a", &server_ip, "-p", &port, "-C", "1000000", "-V"],
        &s_out,
    );
    std::thread::sleep(Duration::from_secs(2));
    let mut client = spawn_in_netns(
        &lib,
        &ns_a,
        &format!("netdev={}", pair.veth(Side::A)),
        "rping",
        &[
            "-c", "-a", &server_ip, "-p", &port, "-C", "1000000", "-V", "-v",
        ],
        &c_out,
    );
    // Pinging for a while.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        matches!(client.child.try_wait(), Ok(None)),
        "the rping client ended before the removal"
    );
    let deleted = std::time::Instant::now();
    pair.netns(Side::A)
        .ip(&["link", "del", pair.veth(Side::A)])
        .expect("ip link del");
    let (c, s) = (
        client.wait(Duration::from_secs(10)),
        server.wait(Duration::from_secs(10)),
    );
    let took = deleted.elapsed();
    for (o, who) in [(&c, "client"), (&s, "server")] {
        assert!(
            o.exited().is_some_and(|code| code != 0),
            "rping {who} should exit with an error after the removal: {:?}\n{}\n{}",
            o.status,
            o.stdout,
            o.stderr
        );
        assert!(
            o.stderr.contains("device removal"),
            "rping {who} did not hear DEVICE_REMOVAL:\n{}",
            o.stderr
        );
    }
    let pings = std::fs::read_to_string(&c_out)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("ping data"))
        .count();
    assert!(pings > 0, "no ping before the removal");
    assert!(
        took < Duration::from_secs(1),
        "both exited {took:?} after the veth was deleted"
    );
    drop(pair);
}
