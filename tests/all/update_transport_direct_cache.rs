//! Direct updates from one sender, repeated, into a receiver that keeps its
//! imports (`UpdateReceiver`), between real processes on the host backend
//! (and CUDA when a GPU is there).
//!
//! Shown: the second and later updates attach nothing and stay bitwise,
//! also for several engines updated in turn from the same sender; a
//! sender that frees and re-allocates its tensors, or sleeps and wakes
//! them, or commits memory again under reused handle ids, between updates
//! is attached again and its new bytes arrive (never the old memory's); a hostile sender claiming a kept share with other
//! segments, or a tensor past the imported segment, is refused with nothing
//! written and the imports dropped, and one naming a new generation or
//! sender at a known path is attached again; a sender killed between
//! updates leaves an error and no import, and one started again at the
//! same path is attached anew; a sender keeps only the shares of its last
//! send, and stops them on request; the receiver's limits bound what
//! it keeps, and dropping the imports makes the next update attach.

use crate::common;
use crate::loader_tp::Model;
use crate::update_transport_direct::{break_rule, in_pool, options, sends, serve_raw};
use crate::update_transport_processes::{sender_pool, sock_path, Proc, SEED, TIMEOUT};
use crate::update_transport_ranks::{model, new_values, write_checkpoint, Rank};

use common::backend::on_each_backend;

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::driver::Driver;
use vmmweights::loader::registry::Destination;
use vmmweights::pool::{Mode, PoolConfig};
use vmmweights::sleep::Policy;
use vmmweights::update::transport::control::{Channel, FromReceiver, FromSender};
use vmmweights::update::transport::import_cache::CacheLimits;
use vmmweights::update::transport::ipc::IpcSender;
use vmmweights::update::transport::receiver::{ReceiverOptions, UpdateReceiver};
use vmmweights::update::{UpdateOptions, UpdateResult};
use vmmweights::{Pool, Status};

use tempfile::TempDir;

/// The values of round `k`: different every round.
fn seed_for(round: usize) -> u64 {
    SEED + 1000 * (round as u64 + 1)
}

/// Write round `seed`'s values into the sender's tensors.
fn fill(pool: &Arc<Pool>, dests: &[Destination], seed: u64) {
    let new = new_values(&model(), seed);
    let driver = pool.driver().clone();
    let stream = driver.stream_create().unwrap();
    for d in dests {
        let bytes = &new[&d.name].1;
        // SAFETY: `d` is this pool's live allocation of `bytes.len()`; the
        // stream is synchronized before `new` goes away.
        unsafe {
            driver
                .copy_htod_async(d.ptr, bytes.as_ptr(), bytes.len(), stream)
                .unwrap();
        }
    }
    driver.stream_synchronize(stream).unwrap();
    driver.stream_destroy(stream).unwrap();
}

/// A direct sender child sending `VMMW_UPDATE_ROUNDS` updates, each with
/// new values; before round k it does `VMMW_UPDATE_CHURN`'s k-th action:
/// `keep`, `realloc` (free every tensor, trim, allocate again), `retrim`
/// (the same but the first tensor stays, so the segment does too) or
/// `sleep` (sleep and wake the tag). With `VMMW_UPDATE_ARENA` set the tag
/// is an arena of one-granule chunks on a driver that reuses released
/// handle ids (as CUDA may).
pub fn child_repeat(path: &Path) {
    let name = "direct-repeat";
    let t = vmmweights::tag::id(name).unwrap();
    let pool = if std::env::var("VMMW_UPDATE_ARENA").is_ok() {
        let driver = crate::update_transport_ranks::host_driver();
        driver.as_host().unwrap().set_reuse_handle_ids(true);
        let mut config = PoolConfig::default();
        config.tag_modes.insert(
            t,
            Mode::Arena {
                reserve_bytes: 8 << 20,
                grow_step: 0,
            },
        );
        Arc::new(Pool::new(driver, config).unwrap())
    } else {
        sender_pool()
    };
    let mut tensors = in_pool(&pool, name);
    let mut sender = IpcSender::bind(pool.clone(), path, options()).unwrap();
    let rounds: usize = std::env::var("VMMW_UPDATE_ROUNDS").map_or(3, |v| v.parse().unwrap());
    let churn = std::env::var("VMMW_UPDATE_CHURN").unwrap_or_default();
    let actions: Vec<&str> = churn.split(',').collect();
    println!("@ready");
    if std::env::var("VMMW_UPDATE_OFFER").is_ok() {
        match sender.offer_direct_to(&sends(&tensors), 1) {
            Ok(r) => println!(
                "@offered version={} shares={}",
                r.version,
                sender.direct_shares()
            ),
            Err(e) => println!("@error {e}"),
        }
    }
    for round in 0..rounds {
        match actions.get(round).copied().unwrap_or("keep") {
            "realloc" => {
                for d in &tensors {
                    pool.free(d.ptr).unwrap();
                }
                pool.trim().unwrap();
                for d in tensors.iter_mut() {
                    d.ptr = pool.alloc_tagged(d.bytes(), t).unwrap().ptr;
                }
            }
            "retrim" => {
                for d in &tensors[1..] {
                    pool.free(d.ptr).unwrap();
                }
                pool.trim().unwrap();
                for d in tensors[1..].iter_mut() {
                    d.ptr = pool.alloc_tagged(d.bytes(), t).unwrap().ptr;
                }
            }
            "sleep" => {
                pool.sleep(&[(t, Policy::Discard)]).unwrap();
                pool.wake(&[t]).unwrap();
            }
            _ => {}
        }
        fill(&pool, &tensors, seed_for(round));
        match sender.send_direct_to(&sends(&tensors), 1) {
            Ok(r) => println!(
                "@sent round={round} version={} shares={}",
                r.version,
                sender.direct_shares()
            ),
            Err(e) => println!("@error {e}"),
        }
    }
}

/// A direct sender by hand: a legitimate update, then one that breaks the
/// rule `VMMW_UPDATE_CASE` names against what the receiver kept.
pub fn child_raw_twice(path: &Path, case: &str) {
    let pool = sender_pool();
    let tensors = in_pool(&pool, "direct-raw-twice");
    fill(&pool, &tensors, seed_for(0));
    let share = PathBuf::from(format!("{}.share", path.display()));
    let (_server, wire, manifest) = serve_raw(&pool, &tensors, &share, 1);
    let listener = UnixListener::bind(path).unwrap();
    println!("@ready");
    for round in 0..2 {
        let (sock, _) = listener.accept().unwrap();
        let mut ch = Channel::new(sock, "receiver", TIMEOUT).unwrap();
        let mut shares = vec![wire.clone()];
        let mut manifest = manifest.clone();
        if round == 1 {
            match case {
                "new_generation" => shares[0].generation += 1,
                "other_sender" => shares[0].sender = "another".into(),
                _ => break_rule(case, &mut shares, &mut manifest),
            }
        }
        ch.send(&FromSender::Direct {
            shares,
            tensors: manifest,
        })
        .unwrap();
        // Attached (or refused), then committed.
        let _ = ch.recv::<FromReceiver>();
        let _ = ch.recv::<FromReceiver>();
    }
    println!("@done");
    std::thread::sleep(Duration::from_secs(600));
}

/// A sender that serves nothing of its own: it sends the message in
/// `VMMW_UPDATE_MESSAGE` (a `FromSender` as JSON), naming another process's
/// shares, to one receiver.
pub fn child_relay(path: &Path) {
    let msg: FromSender =
        serde_json::from_str(&std::env::var("VMMW_UPDATE_MESSAGE").unwrap()).unwrap();
    let listener = UnixListener::bind(path).unwrap();
    println!("@ready");
    let (sock, _) = listener.accept().unwrap();
    let mut ch = Channel::new(sock, "receiver", TIMEOUT).unwrap();
    ch.send(&msg).unwrap();
    let _ = ch.recv::<FromReceiver>();
    println!("@done");
    std::thread::sleep(Duration::from_secs(600));
}

fn receive(rx: &mut UpdateReceiver, r: &Rank) -> vmmweights::Result<UpdateResult> {
    rx.receive(
        &r.session,
        &r.pool,
        &UpdateOptions::from_version(r.version()),
    )
}

fn receiver(r: &Rank, path: &Path, cache: CacheLimits) -> UpdateReceiver {
    UpdateReceiver::new(
        r.pool.driver().clone(),
        path,
        ReceiverOptions {
            timeout: TIMEOUT,
            cache,
        },
    )
}

/// The test model and a checkpoint of it for the engines to load.
fn checkpoint() -> (Model, TempDir) {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    (m, dir)
}

/// A child in `role` at `path`, once it says it is ready.
fn ready(role: &str, path: &Path, env: &[(&str, String)]) -> Proc {
    let child = Proc::spawn(role, path, env);
    assert_eq!(child.line(), "ready");
    child
}

/// A [`child_repeat`] sender at `path` sending `rounds` updates, ready.
fn repeat_sender(path: &Path, rounds: usize, env: &[(&str, String)]) -> Proc {
    let mut env = env.to_vec();
    env.push(("VMMW_UPDATE_ROUNDS", rounds.to_string()));
    ready("direct_repeat", path, &env)
}

/// Whether `r` holds bitwise the values of round `round`.
fn holds_round(r: &Rank, m: &Model, round: usize) -> bool {
    r.snapshot() == r.expected(m, &new_values(m, seed_for(round)))
}

/// Receive round `round`'s update into `r`; it arrives bitwise.
fn receive_round(rx: &mut UpdateReceiver, r: &Rank, m: &Model, round: usize) -> UpdateResult {
    let done = receive(rx, r).unwrap_or_else(|e| panic!("round {round}: {e}"));
    assert!(
        holds_round(r, m, round),
        "round {round}: the sender's new bytes arrive bitwise"
    );
    done
}

/// The last receive attached the sender's share anew (`fresh`: the
/// manifest was new to the receiver) or reused the import it kept (and
/// recognized the manifest, the last one byte for byte).
fn assert_attached(rx: &UpdateReceiver, fresh: bool, what: &str) {
    let s = rx.last_receive().unwrap();
    let want = if fresh { (1, 0, false) } else { (0, 1, true) };
    assert_eq!((s.attached, s.reused, s.recognized), want, "{what}: {s:?}");
}

/// The sender reports round `round` sent.
fn assert_sent(sender: &Proc, round: usize) {
    let line = sender.line();
    assert!(line.starts_with(&format!("sent round={round} ")), "{line}");
}

#[test]
fn repeated_direct_updates_attach_once_and_stay_bitwise() {
    let (m, dir) = checkpoint();
    on_each_backend(
        "repeated_direct_updates_attach_once_and_stay_bitwise",
        |b| {
            let path = sock_path(&format!("direct-repeat-{}", b.kind()));
            let rounds = 5;
            let backend = [("VMMW_UPDATE_BACKEND", b.kind().to_string())];
            let sender = repeat_sender(&path, rounds, &backend);
            let name = format!("direct-repeat-{}", b.kind());
            let r = Rank::load_on(b.driver.clone(), dir.path(), &m, &name, 0, 1);
            let mut rx = receiver(&r, &path, CacheLimits::default());
            for round in 0..rounds {
                let v0 = r.version();
                let done = receive_round(&mut rx, &r, &m, round);
                assert_eq!(done.version, v0 + 1);
                assert!(!done.staged);
                let s = rx.last_receive().unwrap();
                assert!(s.direct);
                if round == 0 {
                    assert_eq!((s.attached, s.reused, s.recognized), (1, 0, false), "{s:?}");
                    assert!(s.chunks > 0, "{s:?}");
                } else {
                    assert_eq!(
                        (s.attached, s.reused, s.chunks, s.recognized),
                        (0, 1, 0, true),
                        "round {round}: {s:?}"
                    );
                }
                assert!(s.setup <= s.total, "{s:?}");
                assert_eq!(rx.kept_imports(), 1);
                assert!(rx.kept_bytes() > 0);
                assert_eq!(
                    sender.line(),
                    format!("sent round={round} version={} shares=1", v0 + 1)
                );
            }
            rx.drop_imports();
            assert_eq!((rx.kept_imports(), rx.kept_bytes()), (0, 0));
        },
    );
}

#[test]
fn freed_reallocated_or_woken_memory_is_attached_again() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-churn");
    let churn = [(
        "VMMW_UPDATE_CHURN",
        "keep,realloc,sleep,keep,realloc".into(),
    )];
    let sender = repeat_sender(&path, 5, &churn);
    let r = Rank::load(dir.path(), &m, "direct-churn", 0, 1);
    let mut rx = receiver(&r, &path, CacheLimits::default());
    // Whether each round's import is attached anew: the memory changed.
    for (round, fresh) in [true, true, true, false, true].into_iter().enumerate() {
        receive_round(&mut rx, &r, &m, round);
        assert_attached(&rx, fresh, &format!("round {round}"));
        assert_eq!(rx.kept_imports(), 1);
        assert_sent(&sender, round);
    }
}

/// A sender whose segment keeps its identity while the memory behind part
/// of it is given back and committed again (an arena trimmed and grown),
/// on a driver that hands the released handle ids out again: the receiver
/// attaches anew and gets the new memory's bytes, never the old memory it
/// kept imported.
#[test]
fn memory_committed_again_under_reused_handle_ids_is_attached_again() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-retrim");
    let churn = [
        ("VMMW_UPDATE_CHURN", "keep,retrim,keep,realloc".into()),
        ("VMMW_UPDATE_ARENA", "1".into()),
    ];
    let sender = repeat_sender(&path, 4, &churn);
    let r = Rank::load(dir.path(), &m, "direct-retrim", 0, 1);
    let mut rx = receiver(&r, &path, CacheLimits::default());
    for (round, fresh) in [true, true, false, true].into_iter().enumerate() {
        receive_round(&mut rx, &r, &m, round);
        assert_attached(&rx, fresh, &format!("round {round}"));
        assert_sent(&sender, round);
    }
}

#[test]
fn hostile_claims_against_kept_imports_are_refused_or_attached_again() {
    let (m, dir) = checkpoint();
    // (case, what the refusal says; None: accepted after attaching again)
    let cases = [
        ("other_segments", Some("the import of that generation maps")),
        ("past_segment", Some("run past segment 0 of share 0")),
        ("offset_overflow", Some("run past segment 0 of share 0")),
        ("unknown_segment", Some("names segment 9 of share 0")),
        ("new_generation", None),
        ("other_sender", None),
    ];
    let r = Rank::load(dir.path(), &m, "direct-hostile-kept", 0, 1);
    for (case, want) in cases {
        let path = sock_path(&format!("direct-kept-{case}"));
        let sender = ready(
            "direct_raw_twice",
            &path,
            &[("VMMW_UPDATE_CASE", case.to_string())],
        );
        let mut rx = receiver(&r, &path, CacheLimits::default());
        receive(&mut rx, &r).unwrap();
        assert_eq!(rx.kept_imports(), 1, "{case}");
        let (before, v0) = (r.snapshot(), r.version());
        match want {
            Some(want) => {
                let e = receive(&mut rx, &r).expect_err(case);
                assert_eq!(e.status(), Status::UpdateSource, "{case}: {e}");
                assert!(e.to_string().contains(want), "{case}: {e}");
                assert!(r.snapshot() == before, "{case}: nothing written");
                assert_eq!(r.version(), v0, "{case}");
                assert_eq!(rx.kept_imports(), 0, "{case}: a refusal drops the imports");
            }
            None => {
                receive(&mut rx, &r).unwrap();
                assert_attached(&rx, true, case);
                assert!(holds_round(&r, &m, 0), "{case}");
            }
        }
        assert_eq!(sender.line(), "done", "{case}");
        sender.kill();
    }
}

#[test]
fn a_sender_killed_between_updates_leaves_an_error_and_no_import() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-killed-between");
    let sender = repeat_sender(&path, 2, &[]);
    let r = Rank::load(dir.path(), &m, "direct-killed-between", 0, 1);
    let mut rx = receiver(&r, &path, CacheLimits::default());
    receive(&mut rx, &r).unwrap();
    assert_sent(&sender, 0);
    assert_eq!(rx.kept_imports(), 1);
    sender.kill();
    let (before, v0) = (r.snapshot(), r.version());
    let e = receive(&mut rx, &r).unwrap_err();
    assert_eq!(e.status(), Status::Io, "{e}");
    assert!(e.to_string().contains("direct-killed-between"), "{e}");
    assert_eq!((rx.kept_imports(), rx.kept_bytes()), (0, 0));
    assert!(r.snapshot() == before, "nothing written");
    assert_eq!(r.version(), v0);
    // A sender started again at the same path: attached anew, its bytes arrive.
    let path = sock_path("direct-killed-between");
    let again = repeat_sender(&path, 2, &[]);
    for (round, fresh) in [true, false].into_iter().enumerate() {
        receive_round(&mut rx, &r, &m, round);
        assert_attached(&rx, fresh, &format!("round {round}"));
        assert_sent(&again, round);
    }
}

#[test]
fn receiver_limits_bound_what_is_kept() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-limits");
    let sender = repeat_sender(&path, 6, &[]);
    let r = Rank::load(dir.path(), &m, "direct-limits", 0, 1);
    let tiny = [
        CacheLimits {
            max_imports: 64,
            max_bytes: 1,
        },
        CacheLimits {
            max_imports: 0,
            max_bytes: u64::MAX,
        },
    ];
    let mut round = 0;
    for limits in tiny {
        let mut rx = receiver(&r, &path, limits);
        for _ in 0..2 {
            receive_round(&mut rx, &r, &m, round);
            assert_attached(&rx, true, &format!("{limits:?}"));
            assert_eq!(rx.kept_imports(), 0, "{limits:?}");
            assert_sent(&sender, round);
            round += 1;
        }
    }
    // Within the limits, until the imports are dropped by request.
    let mut rx = receiver(&r, &path, CacheLimits::default());
    for _ in 0..2 {
        receive_round(&mut rx, &r, &m, round);
        assert_attached(&rx, true, &format!("round {round}"));
        assert_eq!(rx.kept_imports(), 1);
        rx.drop_imports();
        assert_sent(&sender, round);
        round += 1;
    }
}

#[test]
fn a_sender_keeps_only_the_shares_of_its_last_send() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-tags");
    let pool = sender_pool();
    let a = in_pool(&pool, "direct-tags-a");
    let b = in_pool(&pool, "direct-tags-b");
    let mut tx = IpcSender::bind(pool.clone(), &path, options()).unwrap();
    let r = Rank::load(dir.path(), &m, "direct-tags", 0, 1);
    let mut rx = receiver(&r, &path, CacheLimits::default());
    let share = |g: u64| PathBuf::from(format!("{}.direct.{g}", path.display()));
    // (what is sent, whether the receiver attaches, the share served after)
    for (round, (tensors, fresh, generation)) in
        [(&a, true, 1), (&a, false, 1), (&b, true, 2), (&a, true, 3)]
            .into_iter()
            .enumerate()
    {
        fill(&pool, tensors, seed_for(round));
        std::thread::scope(|s| {
            let sent = s.spawn(|| tx.send_direct_to(&sends(tensors), 1));
            receive(&mut rx, &r).unwrap();
            sent.join().unwrap().unwrap();
        });
        assert!(holds_round(&r, &m, round), "round {round}");
        assert_attached(&rx, fresh, &format!("round {round}"));
        assert_eq!(
            (tx.direct_shares(), rx.kept_imports()),
            (1, 1),
            "round {round}"
        );
        for g in 1..=3 {
            assert_eq!(
                share(g).exists(),
                g == generation,
                "round {round}: share {g}"
            );
        }
    }
    tx.stop_direct_shares();
    assert_eq!(tx.direct_shares(), 0);
    assert!(!share(3).exists());
    // The receiver's import outlives the share: the memory stays mapped.
    assert_eq!(rx.kept_imports(), 1);
    assert!(rx.kept_bytes() > 0);
}

/// A receiver made for one device, handed a pool on another (a careless
/// caller): refused before it connects, nothing written, the tag not marked
/// torn, its kept imports kept; the same receiver then receives into its own
/// device's pool, reusing them.
#[test]
fn a_pool_on_another_device_is_refused_before_anything_moves() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-other-device");
    let sender = repeat_sender(&path, 2, &[]);
    let r = Rank::load(dir.path(), &m, "direct-other-device", 0, 1);
    let other_driver: Arc<dyn Driver> = Arc::new(
        HostDriver::for_device(
            HostConfig {
                granularity: 64 << 10,
                memory_limit: 1 << 30,
            },
            1,
        )
        .unwrap(),
    );
    let other = Rank::load_on(other_driver, dir.path(), &m, "direct-other-device-1", 0, 1);
    let mut rx = receiver(&r, &path, CacheLimits::default());
    receive(&mut rx, &r).unwrap();
    assert_eq!(rx.kept_imports(), 1);
    assert_sent(&sender, 0);
    let (before, v0) = (other.snapshot(), other.version());
    let e = receive(&mut rx, &other).expect_err("a pool on another device");
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.to_string().contains("device 1"), "{e}");
    assert!(other.snapshot() == before, "nothing written");
    assert_eq!(other.version(), v0);
    assert!(!other.pool.tag_torn(other.tag).unwrap(), "not marked torn");
    assert_eq!(rx.kept_imports(), 1, "bad input changes nothing");
    receive_round(&mut rx, &r, &m, 1);
    assert_attached(&rx, false, "its own device's pool");
    assert_sent(&sender, 1);
}

/// One sender updating several engines in turn (each send to one
/// receiver), each engine keeping its imports: every engine's update
/// arrives, the later rounds without an attach.
#[test]
fn engines_served_in_turn_each_keep_their_imports() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-in-turn");
    let engines = 4;
    let rounds = 2 * engines;
    let sender = repeat_sender(&path, rounds, &[]);
    let ranks: Vec<Rank> = (0..engines)
        .map(|k| Rank::load(dir.path(), &m, &format!("direct-in-turn-{k}"), 0, 1))
        .collect();
    let mut rxs: Vec<UpdateReceiver> = ranks
        .iter()
        .map(|r| receiver(r, &path, CacheLimits::default()))
        .collect();
    for round in 0..rounds {
        let k = round % engines;
        receive_round(&mut rxs[k], &ranks[k], &m, round);
        assert_attached(&rxs[k], round < engines, &format!("round {round}"));
        assert_sent(&sender, round);
    }
}

/// A sender naming a share another process serves (here the receiving
/// process itself, which any sender could name) is refused: the receiver
/// copies only memory of the process on the control socket. Nothing is
/// written and nothing kept.
/// A share the process on the control socket does not serve is refused:
/// named by a sender that serves nothing, and also when it sends, byte for
/// byte, the manifest the receiver admitted from the process that serves
/// it (a replay the receiver recognizes: its kept imports are still checked
/// against the sender).
#[test]
fn a_share_served_by_another_process_is_refused() {
    let (m, dir) = checkpoint();
    let pool = sender_pool();
    let tensors = in_pool(&pool, "direct-foreign-source");
    let share = sock_path("direct-foreign-share");
    let (_server, wire, manifest) = serve_raw(&pool, &tensors, &share, 1);
    let msg = FromSender::Direct {
        shares: vec![wire],
        tensors: manifest,
    };
    let r = Rank::load(dir.path(), &m, "direct-foreign", 0, 1);
    let path = sock_path("direct-foreign");
    let mut rx = receiver(&r, &path, CacheLimits::default());
    // This process serves the share and sends it itself: accepted.
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let (sock, _) = listener.accept().unwrap();
            let mut ch = Channel::new(sock, "receiver", TIMEOUT).unwrap();
            ch.send(&msg).unwrap();
            let _ = ch.recv::<FromReceiver>();
            let _ = ch.recv::<FromReceiver>();
        });
        receive(&mut rx, &r).unwrap();
    });
    drop(listener);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(rx.kept_imports(), 1);
    for replay in [true, false] {
        let relay = ready(
            "direct_relay",
            &path,
            &[("VMMW_UPDATE_MESSAGE", serde_json::to_string(&msg).unwrap())],
        );
        if !replay {
            rx = receiver(&r, &path, CacheLimits::default());
        }
        let (before, v0) = (r.snapshot(), r.version());
        let e = receive(&mut rx, &r).expect_err("another process's share");
        assert_eq!(e.status(), Status::UpdateSource, "replay {replay}: {e}");
        assert!(
            e.to_string().contains("not by the sender"),
            "replay {replay}: {e}"
        );
        assert!(r.snapshot() == before, "replay {replay}: nothing written");
        assert_eq!(r.version(), v0);
        assert_eq!(rx.kept_imports(), 0);
        assert_eq!(relay.line(), "done");
        relay.kill();
        let _ = std::fs::remove_file(&path);
    }
}

/// The documented first-update path: the sender offers its tensors and the
/// receiver prepares before any update, so the first update attaches and
/// checks nothing (it recognizes the offered manifest), as later ones.
#[test]
fn an_offer_taken_by_prepare_makes_the_first_update_attach_nothing() {
    let (m, dir) = checkpoint();
    on_each_backend(
        "an_offer_taken_by_prepare_makes_the_first_update_attach_nothing",
        |b| {
            let path = sock_path(&format!("direct-offer-{}", b.kind()));
            let env = [
                ("VMMW_UPDATE_BACKEND", b.kind().to_string()),
                ("VMMW_UPDATE_OFFER", "1".to_string()),
            ];
            let sender = repeat_sender(&path, 3, &env);
            let name = format!("direct-offer-{}", b.kind());
            let r = Rank::load_on(b.driver.clone(), dir.path(), &m, &name, 0, 1);
            let before = r.snapshot();
            let mut rx = receiver(&r, &path, CacheLimits::default());
            let v0 = r.version();
            let s = rx
                .prepare(&r.session, &r.pool, &UpdateOptions::from_version(v0))
                .unwrap();
            assert_eq!((s.attached, s.reused, s.direct), (1, 0, true), "{s:?}");
            assert!(s.chunks > 0 && s.setup <= s.total, "{s:?}");
            assert_eq!(sender.line(), "offered version=0 shares=1");
            assert_eq!(r.version(), v0, "preparing moves no version");
            assert!(r.snapshot() == before, "preparing writes nothing");
            assert_eq!(rx.kept_imports(), 1);
            for round in 0..3 {
                receive_round(&mut rx, &r, &m, round);
                assert_attached(&rx, false, &format!("round {round} after the offer"));
                assert_sent(&sender, round);
            }
        },
    );
}

/// A receiver that meets an offer in a plain receive takes it (attaching
/// the shares) and goes on to the update that follows.
#[test]
fn a_receive_that_meets_an_offer_takes_it_and_receives_the_update() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-offer-receive");
    let sender = repeat_sender(&path, 2, &[("VMMW_UPDATE_OFFER", "1".into())]);
    let r = Rank::load(dir.path(), &m, "direct-offer-receive", 0, 1);
    let mut rx = receiver(&r, &path, CacheLimits::default());
    receive_round(&mut rx, &r, &m, 0);
    assert_eq!(sender.line(), "offered version=0 shares=1");
    assert_attached(&rx, false, "the update after the offer");
    assert_sent(&sender, 0);
    receive_round(&mut rx, &r, &m, 1);
    assert_sent(&sender, 1);
}

/// A receiver that prepares refuses a sender that sends an update instead
/// of an offer: the sender is told, nothing is written, nothing is kept.
#[test]
fn prepare_refuses_an_update_in_place_of_an_offer() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-offer-refused");
    let sender = repeat_sender(&path, 1, &[]);
    let r = Rank::load(dir.path(), &m, "direct-offer-refused", 0, 1);
    let before = r.snapshot();
    let mut rx = receiver(&r, &path, CacheLimits::default());
    let e = rx
        .prepare(
            &r.session,
            &r.pool,
            &UpdateOptions::from_version(r.version()),
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidState, "{e}");
    assert!(e.to_string().contains("expected an offer"), "{e}");
    let line = sender.line();
    assert!(
        line.starts_with("error ") && line.contains("expected an offer"),
        "{line}"
    );
    assert!(r.snapshot() == before);
    assert_eq!(rx.kept_imports(), 0);
}

/// An offer whose tensors the receiver's destinations cannot take is
/// refused by prepare (the update's own checks), the sender told why.
#[test]
fn prepare_refuses_an_offer_its_destinations_cannot_take() {
    let (m, dir) = checkpoint();
    let path = sock_path("direct-offer-plan");
    let sender = repeat_sender(&path, 1, &[("VMMW_UPDATE_OFFER", "1".into())]);
    let r = Rank::load(dir.path(), &m, "direct-offer-plan", 0, 1);
    let mut rx = receiver(&r, &path, CacheLimits::default());
    // A version the tag does not hold: the update's version check refuses.
    let e = rx
        .prepare(
            &r.session,
            &r.pool,
            &UpdateOptions::from_version(r.version() + 7),
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::VersionMismatch, "{e}");
    let line = sender.line();
    assert!(line.starts_with("error "), "{line}");
    assert_eq!(rx.kept_imports(), 0);
}
