//! Repeated updates, as an RL loop makes them: the kept plan serves every
//! step, yet nothing is skipped. A source that moved to new addresses is
//! read at its new addresses, a changed shape is refused with nothing
//! written, versions move at each step, a Reload sleep afterwards brings the
//! last update back, and each result says where its time went.

use crate::common;

use common::backend::on_each_backend;
use common::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::update::{self, Bytes, Tensors as Src, UpdateOptions};
use vmmweights::{loader::Dtype, Status};

use crate::update::{on_device, setup, snapshot, trainer_values};

/// The 8B checkpoint's layout (399 tensors into 291 fused destinations
/// through the qwen3 preset) with small dimensions.
const MANY: Shape = Shape {
    layers: 36,
    ..SMALL
};

#[test]
fn repeated_updates_read_moved_sources_and_move_the_version_each_step() {
    on_each_backend("repeated_updates", |b| {
        let s = setup(
            b,
            &format!("update-repeat-{}", b.kind()),
            &SMALL,
            "qwen3",
            None,
        );
        let v0 = s.pool.tag_version(s.tag).unwrap();
        // Other values first, so that a stale read of them would show.
        let other = trainer_values(&SMALL, 5000);
        let (_seg_other, mut src_other) = on_device(&s.driver, &other);
        let r = update::update(
            &s.session,
            &s.pool,
            &mut src_other,
            &UpdateOptions::from_version(v0),
        )
        .unwrap();
        assert_eq!(r.version, v0 + 1);
        let after_other = snapshot(s.driver.as_ref(), &s.session);
        assert_ne!(after_other, s.want);
        // The same names and shapes at new addresses: read there.
        let (_seg_new, mut src_new) = on_device(&s.driver, &s.new);
        let r = update::update(
            &s.session,
            &s.pool,
            &mut src_new,
            &UpdateOptions::from_version(v0 + 1),
        )
        .unwrap();
        assert_eq!(r.version, v0 + 2);
        assert_eq!(
            snapshot(s.driver.as_ref(), &s.session),
            s.want,
            "the moved source was read at its new addresses"
        );
        // Back to the first source: its bytes again.
        let r = update::update(
            &s.session,
            &s.pool,
            &mut src_other,
            &UpdateOptions::from_version(v0 + 2),
        )
        .unwrap();
        assert_eq!(r.version, v0 + 3);
        assert_eq!(snapshot(s.driver.as_ref(), &s.session), after_other);
        // And the new values once more, then Reload keeps them.
        update::update(
            &s.session,
            &s.pool,
            &mut src_new,
            &UpdateOptions::from_version(v0 + 3),
        )
        .unwrap();
        s.pool.sleep(&[(s.tag, Policy::Reload)]).unwrap();
        s.pool.wake(&[s.tag]).unwrap();
        assert_eq!(
            snapshot(s.driver.as_ref(), &s.session),
            s.want,
            "Reload brought the last update back"
        );
        assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0 + 4);
    });
}

#[test]
fn a_changed_shape_after_repeated_updates_is_refused_and_writes_nothing() {
    on_each_backend("changed_shape_after_updates", |b| {
        let s = setup(
            b,
            &format!("update-reshape-{}", b.kind()),
            &SMALL,
            "qwen3",
            None,
        );
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let (_seg, mut src) = on_device(&s.driver, &s.new);
        for i in 0..3 {
            update::update(
                &s.session,
                &s.pool,
                &mut src,
                &UpdateOptions::from_version(v0 + i),
            )
            .unwrap();
        }
        let before = snapshot(s.driver.as_ref(), &s.session);
        // One tensor's shape differs; the rest as before, at the same addresses.
        let mut bad = Src::new();
        let mut shapes = s.new.iter();
        let (first, (shape, bytes)) = shapes.next().unwrap();
        let flat = vec![shape.iter().product::<usize>()];
        // SAFETY: the host bytes outlive the update.
        unsafe { bad.add(first, Dtype::Bf16, &flat, Bytes::Host(bytes.as_ptr())) }.unwrap();
        for (name, (shape, bytes)) in shapes {
            // SAFETY: as above.
            unsafe { bad.add(name, Dtype::Bf16, shape, Bytes::Host(bytes.as_ptr())) }.unwrap();
        }
        let e = update::update(
            &s.session,
            &s.pool,
            &mut bad,
            &UpdateOptions::from_version(v0 + 3),
        )
        .unwrap_err();
        assert_eq!(e.status(), Status::PlanMismatch, "{e}");
        assert!(e.to_string().contains(first.as_str()), "{e}");
        assert_eq!(
            snapshot(s.driver.as_ref(), &s.session),
            before,
            "nothing written"
        );
        assert_eq!(
            s.pool.tag_version(s.tag).unwrap(),
            v0 + 3,
            "the version stays"
        );
    });
}

#[test]
fn an_update_reports_where_its_time_went() {
    on_each_backend("update_phases", |b| {
        let s = setup(
            b,
            &format!("update-phases-{}", b.kind()),
            &MANY,
            "qwen3",
            None,
        );
        assert_eq!(s.new.len(), 399);
        assert_eq!(s.session.destination_count(), 291);
        let (_seg, mut src) = on_device(&s.driver, &s.new);
        let mut v = s.pool.tag_version(s.tag).unwrap();
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            let r = update::update(
                &s.session,
                &s.pool,
                &mut src,
                &UpdateOptions::from_version(v),
            )
            .unwrap();
            let wall = t0.elapsed().as_secs_f64();
            let p = r.phases;
            eprintln!(
                "{}: plan {:.3} ms, issue {:.3} ms, wait {:.3} ms, bookkeeping {:.3} ms; call {:.3} ms",
                b.kind(),
                p.plan * 1e3,
                p.issue * 1e3,
                p.wait * 1e3,
                p.bookkeeping * 1e3,
                wall * 1e3
            );
            for (name, x) in [
                ("plan", p.plan),
                ("issue", p.issue),
                ("wait", p.wait),
                ("bookkeeping", p.bookkeeping),
            ] {
                assert!(x > 0.0, "{name} took no time: {p:?}");
            }
            let sum = p.plan + p.issue + p.wait + p.bookkeeping;
            assert!(sum <= wall, "phases {sum} s exceed the call's {wall} s");
            assert!(
                sum >= 0.5 * wall,
                "phases {sum} s miss most of the call's {wall} s"
            );
            assert!(r.seconds <= sum, "{} s of copies in {sum} s", r.seconds);
            v = r.version;
        }
        assert_eq!(snapshot(s.driver.as_ref(), &s.session), s.want);
    });
}
