//! Attacks on a control socket from another process. The test binary runs
//! itself as the attacker (`control_attacks::child`, a no-op unless
//! `VMMW_CONTROL_ATTACK` is set), which speaks the socket by hand and reports
//! on stdout lines starting with `@`. The server serves a counting target,
//! so a test sees that nothing hostile reached a sleep or a wake.
//!
//! Shown: bad lines (not JSON, not UTF-8, unknown operations and fields,
//! out-of-range values, nesting past the parser's limit) are refused with
//! the reason and the connection stays usable; a line over the bound is
//! refused and the connection closed; silent and dripping peers are cut at
//! one deadline; a flood of connections is bounded and refused with the
//! reason; a peer of another user is refused before anything is read.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use vmmweights::control::{
    Client, ControlLog, ControlOptions, Controlled, CycleAnswer, Phase, Server, StatusAnswer,
    WirePolicy,
};
use vmmweights::{Result, Status};

/// Counts what reached it.
#[derive(Default)]
struct Target {
    statuses: AtomicU64,
    sleeps: AtomicU64,
    wakes: AtomicU64,
}

fn cycle(op: &str) -> CycleAnswer {
    CycleAnswer {
        ok: true,
        op: op.into(),
        policy: None,
        seconds: 0.0,
        sync_seconds: 0.0,
        wait_seconds: 0.0,
        synced_devices: Vec::new(),
        bytes: 0,
        backup_bytes: 0,
        tags: Vec::new(),
    }
}

impl Controlled for Target {
    fn status(&self) -> Result<StatusAnswer> {
        self.statuses.fetch_add(1, Ordering::Relaxed);
        Ok(StatusAnswer {
            ok: true,
            pid: std::process::id(),
            state: Phase::Awake,
            tags: Vec::new(),
            devices: Vec::new(),
            host_backup_bytes: 0,
            last: None,
            extra: Map::new(),
        })
    }

    fn sleep(&self, _: WirePolicy, _: Option<&[String]>) -> Result<CycleAnswer> {
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        Ok(cycle("sleep"))
    }

    fn wake(&self, _: Option<&[String]>, _: Option<Duration>) -> Result<CycleAnswer> {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        Ok(cycle("wake"))
    }
}

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmmw-control-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

fn serve(name: &str, options: ControlOptions) -> (Server, Arc<Target>, PathBuf) {
    let target = Arc::new(Target::default());
    let path = socket_path(name);
    let server = Server::start(
        &path,
        target.clone(),
        ControlOptions {
            log: ControlLog::discard(),
            ..options
        },
    )
    .unwrap();
    (server, target, path)
}

/// Run the attacker `role` against `path`; its `@` lines.
fn attack(role: &str, path: &Path) -> Vec<String> {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "control_attacks::child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VMMW_CONTROL_ATTACK", role)
        .env("VMMW_CONTROL_ATTACK_PATH", path)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "attacker {role} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('@').map(|(_, r)| r.to_owned()))
        .collect()
}

fn nothing_reached(t: &Target) {
    assert_eq!(t.sleeps.load(Ordering::Relaxed), 0, "a sleep got through");
    assert_eq!(t.wakes.load(Ordering::Relaxed), 0, "a wake got through");
}

/// The attacker's side; a no-op unless this binary was started as one.
#[test]
fn child() {
    let Ok(role) = std::env::var("VMMW_CONTROL_ATTACK") else {
        return;
    };
    let path = PathBuf::from(std::env::var("VMMW_CONTROL_ATTACK_PATH").unwrap());
    match role.as_str() {
        "garbage" => garbage(&path),
        "long" => long_line(&path),
        "silent" => silent(&path),
        "drip" => drip(&path),
        "flood" => flood(&path),
        "other-uid" => other_uid(&path),
        other => panic!("unknown role {other}"),
    }
}

/// Send `bytes` and read one answer line: its code ("ok" for a success).
fn ask(s: &mut BufReader<UnixStream>, bytes: &[u8]) -> String {
    // A refusal may come before the request is read: the write may fail.
    let _ = s.get_mut().write_all(bytes);
    let mut line = String::new();
    s.read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    match v.get("ok") {
        Some(Value::Bool(true)) => "ok".into(),
        _ => format!(
            "{} {}",
            v["code"].as_str().unwrap_or("none"),
            v["error"].as_str().unwrap_or(&line).replace('\n', " ")
        ),
    }
}

fn garbage(path: &Path) {
    let s = UnixStream::connect(path).unwrap();
    let mut s = BufReader::new(s);
    let many_tags: Vec<String> = (0..1025).map(|i| format!("t{i}")).collect();
    let nested = format!(
        "{{\"op\":\"status\",\"x\":{}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let lines: Vec<Vec<u8>> = vec![
        b"not json\n".to_vec(),
        b"{\"op\":\"explode\"}\n".to_vec(),
        b"{\"op\":\"status\",\"x\":1}\n".to_vec(),
        b"{\"op\":\"sleep\",\"policy\":\"reload\"}\n".to_vec(),
        b"{\"op\":\"sleep\",\"tags\":[]}\n".to_vec(),
        b"{\"op\":\"sleep\",\"tags\":[\"\"]}\n".to_vec(),
        b"{\"op\":\"wake\",\"wait_memory_ms\":99999999999}\n".to_vec(),
        b"{\"op\":\"wake\",\"wait_memory_ms\":-5}\n".to_vec(),
        format!(
            "{{\"op\":\"sleep\",\"tags\":{}}}\n",
            serde_json::to_string(&many_tags).unwrap()
        )
        .into_bytes(),
        format!("{nested}\n").into_bytes(),
        vec![0xff, 0xfe, b'{', b'\n'],
        b"{\"op\":\"sleep\"} {\"op\":\"wake\"}\n".to_vec(),
        b"[\"op\",\"sleep\"]\n".to_vec(),
    ];
    for l in &lines {
        println!("@{}", ask(&mut s, l));
    }
    println!("@{}", ask(&mut s, b"{\"op\":\"status\"}\n"));
}

fn long_line(path: &Path) {
    let s = UnixStream::connect(path).unwrap();
    let mut s = BufReader::new(s);
    let answer = ask(&mut s, &vec![b'x'; 70 << 10]);
    let mut rest = Vec::new();
    // Closed either way: at the end of what was sent, or reset because the
    // server closed with the rest of the line unread.
    let closed = match s.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    println!("@{answer}");
    println!("@closed={closed} rest={}", rest.len());
}

/// Three peers that connect and send nothing: when each is cut, and what it read.
fn silent(path: &Path) {
    let t = Instant::now();
    let socks: Vec<UnixStream> = (0..3).map(|_| UnixStream::connect(path).unwrap()).collect();
    for s in socks {
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        println!(
            "@ms={} code={} {}",
            t.elapsed().as_millis(),
            v["code"].as_str().unwrap_or("none"),
            v["error"].as_str().unwrap_or("")
        );
    }
}

/// A valid request, one byte every 150 ms.
fn drip(path: &Path) {
    let t = Instant::now();
    let mut s = UnixStream::connect(path).unwrap();
    for b in b"{\"op\":\"sleep\"}\n" {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    let mut line = String::new();
    let _ = BufReader::new(s).read_line(&mut line);
    let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    println!(
        "@ms={} code={}",
        t.elapsed().as_millis(),
        v["code"].as_str().unwrap_or("none")
    );
}

/// Thirty connections at once, held: how many were refused, and why.
fn flood(path: &Path) {
    let socks: Vec<UnixStream> = (0..30)
        .map(|_| UnixStream::connect(path).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (mut refused, mut held, mut why) = (0, 0, String::new());
    for s in &socks {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        match (&*s).read(&mut buf) {
            Ok(n) if n > 0 => {
                refused += 1;
                why = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
            }
            _ => held += 1,
        }
    }
    println!("@refused={refused} held={held} {why}");
    println!("@ready");
    // Held until the test has counted them.
    std::thread::sleep(Duration::from_millis(1500));
    drop(socks);
}

/// Become another user, then ask.
fn other_uid(path: &Path) {
    // SAFETY: setgid/setuid have no memory-safety preconditions; this
    // process only connects afterwards.
    let rc = unsafe { libc::setgid(65534) | libc::setuid(65534) };
    assert_eq!(rc, 0, "cannot become uid 65534");
    match UnixStream::connect(path) {
        Err(e) => println!("@connect failed: {e}"),
        Ok(s) => {
            let mut s = BufReader::new(s);
            let t = Instant::now();
            let code = ask(&mut s, b"{\"op\":\"sleep\"}\n");
            println!("@ms={} {code}", t.elapsed().as_millis());
        }
    }
}

#[test]
fn hostile_lines_are_refused_with_the_reason_and_change_nothing() {
    let (_server, target, path) = serve("garbage", ControlOptions::default());
    let lines = attack("garbage", &path);
    assert_eq!(lines.len(), 14, "{lines:#?}");
    for l in &lines[..13] {
        assert!(l.starts_with("VMMW_INVALID_ARGUMENT "), "{l}");
    }
    assert!(
        lines[0].contains("one JSON object per line"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("unknown variant `explode`"),
        "{}",
        lines[1]
    );
    assert!(lines[2].contains("unknown field `x`"), "{}", lines[2]);
    assert!(lines[6].contains("one hour"), "{}", lines[6]);
    assert!(lines[8].contains("at most 1024"), "{}", lines[8]);
    assert!(lines[9].contains("recursion limit"), "{}", lines[9]);
    assert!(lines[10].contains("not UTF-8"), "{}", lines[10]);
    // The connection stayed usable through all of it.
    assert_eq!(lines[13], "ok");
    nothing_reached(&target);
    assert_eq!(target.statuses.load(Ordering::Relaxed), 1);
}

#[test]
fn a_line_over_the_bound_is_refused_and_the_connection_closed() {
    let (server, target, path) = serve("long", ControlOptions::default());
    let lines = attack("long", &path);
    assert!(
        lines[0].starts_with("VMMW_INVALID_ARGUMENT ") && lines[0].contains("65536"),
        "{lines:?}"
    );
    assert_eq!(lines[1], "closed=true rest=0");
    nothing_reached(&target);
    let t = Instant::now();
    while server.connections() > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the connection is still counted"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn silent_and_dripping_peers_are_cut_at_one_deadline() {
    let (server, target, path) = serve(
        "silent",
        ControlOptions {
            request_timeout: Duration::from_millis(1000),
            ..ControlOptions::default()
        },
    );
    let lines = attack("silent", &path);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for l in &lines {
        let ms: u64 = l["ms=".len()..].split(' ').next().unwrap().parse().unwrap();
        assert!((900..4000).contains(&ms), "cut at the 1 s deadline: {l}");
        assert!(
            l.contains("code=VMMW_IO") && l.contains("no complete request"),
            "{l}"
        );
    }
    let lines = attack("drip", &path);
    let ms: u64 = lines[0]["ms=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (900..2400).contains(&ms),
        "a dripping peer cannot stretch its deadline: {lines:?}"
    );
    assert!(lines[0].ends_with("code=VMMW_IO"), "{lines:?}");
    nothing_reached(&target);
    assert_eq!(server.connections(), 0);
}

#[test]
fn a_flood_of_connections_is_bounded_and_refused_with_the_reason() {
    let (server, target, path) = serve(
        "flood",
        ControlOptions {
            max_connections: 4,
            ..ControlOptions::default()
        },
    );
    let path2 = path.clone();
    let counted = std::thread::spawn(move || {
        let mut most = 0;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1800) {
            most = most.max(server.connections());
            std::thread::sleep(Duration::from_millis(5));
        }
        (most, server)
    });
    let lines = attack("flood", &path2);
    let (most, server) = counted.join().unwrap();
    assert!(lines[0].starts_with("refused=26 held=4 "), "{lines:?}");
    assert!(
        lines[0].contains("VMMW_SHARE_REFUSED") && lines[0].contains("too many connections"),
        "{lines:?}"
    );
    assert!(most <= 4, "{most} connections served at once");
    assert!(server.refused() >= 26);
    // Served as usual once the flood is gone.
    Client::connect(&path).unwrap().status().unwrap();
    nothing_reached(&target);
}

#[test]
fn peers_of_another_user_are_refused_before_anything_is_read() {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let (_server, target, path) = serve(
        "uid",
        ControlOptions {
            allowed_uids: Some(vec![me.wrapping_add(1)]),
            ..ControlOptions::default()
        },
    );
    let t = Instant::now();
    let e = Client::connect(&path).unwrap().status().unwrap_err();
    assert_eq!(e.status(), Status::ShareRefused, "{e}");
    assert!(e.to_string().contains("is not allowed"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
    nothing_reached(&target);
    assert_eq!(target.statuses.load(Ordering::Relaxed), 0);
    if me != 0 {
        println!("control_attacks: not root, the other-uid attacker is not run (the allow-list case above stands in)");
        return;
    }
    // A real process of another user: the socket (0600) refuses it the
    // connection; opened to everyone, the peer check refuses it.
    let (_server, target, path) = serve("uid-real", ControlOptions::default());
    let lines = attack("other-uid", &path);
    assert!(lines[0].contains("Permission denied"), "{lines:?}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        path.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let lines = attack("other-uid", &path);
    assert!(
        lines[0].contains("VMMW_SHARE_REFUSED") && lines[0].contains("uid 65534 is not allowed"),
        "{lines:?}"
    );
    nothing_reached(&target);
}
