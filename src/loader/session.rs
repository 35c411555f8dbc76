//! [`Session`]: one checkpoint being loaded, from open to the last result.
//!
//! A session owns what a load needs between calls: the checkpoint (opened
//! again after a load consumed it), the mapping rules, the destinations, the
//! load options and the last executed plan. The C handle `vmmw_loader_t`,
//! the command line and the share server all drive this one object, so the
//! order open, rules, allocate, plan, load is written once.
//!
//! Thread safety: every method takes `&self`; calls serialize on an inner
//! lock (a load holds it for its duration), except [`Session::cancel`], which
//! any thread may call while a load runs.
//!
//! The cancel rule: a cancel request stays pending until a load of this
//! session reaches its copies. A load that ran its copies (finished, or
//! stopped by the cancel) clears it; a load refused before its copies (a plan
//! error, a checkpoint changed since open, a bad destination) leaves it
//! pending, so the next load stops before writing anything. A load across
//! devices ([`Session::load_many`]) watches the first session's request and
//! applies the same rule to every session it was given.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    allocate_in_pool, load_into_pool, Checkpoint, Control, CopyOptions, DestSpec, Destination,
    Dtype, ExecutedPlan, LoadOptions, Plan, PlanOptions, Registry, Rules, TensorInfo, Tp,
};
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::tag::TagId;

/// What a plan will do ([`Session::plan`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanSummary {
    /// Copies planned.
    pub extents: u64,
    /// Zero fills planned (padding).
    pub fills: u64,
    /// Bytes read from the checkpoint.
    pub src_bytes: u64,
    /// Bytes written to destinations.
    pub dst_bytes: u64,
    /// Source tensors loaded.
    pub sources: u64,
    /// Source tensors skipped by a rule.
    pub skipped: u64,
    /// Destinations left untouched (allowed missing).
    pub missing: u64,
    /// Sources with no destination (allowed unexpected).
    pub unexpected: u64,
    /// Destinations registered.
    pub destinations: u64,
}

/// One device's part of a load into pools: its pool, rules and destinations
/// (what [`Session::load_many`] hands the load across devices).
#[derive(Debug, Clone, Copy)]
pub struct PoolLoad<'a> {
    /// The device's pool; its destinations should live in it.
    pub pool: &'a Pool,
    /// The device's rules.
    pub rules: &'a Rules,
    /// The device's destinations.
    pub registry: &'a Registry,
}

/// Progress of a load: bytes done and the total; `Break` requests
/// cancellation (as [`Session::cancel`]).
pub type Progress<'a> = &'a dyn Fn(u64, u64) -> ControlFlow<()>;

struct State {
    path: PathBuf,
    /// Opened lazily again after a load consumed it.
    ckpt: Option<Checkpoint>,
    rules: Rules,
    /// Shared with updates in flight: changed copy-on-write.
    registry: Arc<Registry>,
    options: LoadOptions,
    executed: Option<Arc<ExecutedPlan>>,
    /// The last plan built for a set of tensors other than the checkpoint
    /// (an update's source), kept while the rules and destinations stay.
    tensor_plan: Option<TensorPlan>,
}

/// A plan [`Session::plan_for`] built, and what it was built from.
struct TensorPlan {
    tensors: BTreeMap<String, TensorInfo>,
    options: PlanOptions,
    plan: Arc<Plan>,
}

impl State {
    fn ckpt(&mut self) -> Result<&Checkpoint> {
        if self.ckpt.is_none() {
            self.ckpt = Some(Checkpoint::open(&self.path)?);
        }
        Ok(self.ckpt.as_ref().expect("set above"))
    }

    fn take_ckpt(&mut self) -> Result<Checkpoint> {
        self.ckpt()?;
        Ok(self.ckpt.take().expect("opened above"))
    }
}

/// One checkpoint being loaded (see the module documentation).
pub struct Session {
    state: Mutex<State>,
    cancel: AtomicBool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never waits for a running load.
        let path = self.state.try_lock().map(|st| st.path.clone()).ok();
        f.debug_struct("Session")
            .field("path", &path)
            .finish_non_exhaustive()
    }
}

/// Clear the cancel requests a load consumed: only a load that ran its
/// copies consumes them (the module's cancel rule).
fn consume_cancel<T>(result: &Result<T>, sessions: &[&Session]) {
    if matches!(result, Ok(_) | Err(Error::Cancelled { .. })) {
        for s in sessions {
            s.cancel.store(false, Ordering::Release);
        }
    }
}

impl Session {
    /// Open a checkpoint: a `.safetensors` file, or a folder holding
    /// `model.safetensors.index.json` (or one `model.safetensors`). Headers
    /// are read and validated now. Initial rules: none (every tensor to the
    /// destination of its own name); default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Session> {
        let path = path.as_ref().to_path_buf();
        let ckpt = Checkpoint::open(&path)?;
        Ok(Session {
            state: Mutex::new(State {
                path,
                ckpt: Some(ckpt),
                rules: Rules::default(),
                registry: Arc::new(Registry::new()),
                options: LoadOptions::default(),
                executed: None,
                tensor_plan: None,
            }),
            cancel: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The path the session opened.
    pub fn path(&self) -> PathBuf {
        self.lock().path.clone()
    }

    /// Replace the mapping rules; they are compiled now and on an error the
    /// previous rules stay.
    pub fn set_rules(&self, rules: Rules) -> Result<()> {
        rules.compile()?;
        let mut st = self.lock();
        st.rules = rules;
        st.tensor_plan = None;
        Ok(())
    }

    /// Replace the mapping rules with a preset for a Hugging Face family
    /// (see [`Rules::preset`]).
    pub fn set_preset(&self, family: &str, tp: Option<Tp>, head_dim: usize) -> Result<()> {
        self.set_rules(Rules::preset(family, tp, head_dim)?)
    }

    /// The mapping rules in use.
    pub fn rules(&self) -> Rules {
        self.lock().rules.clone()
    }

    /// Set the plan and copy options; the copy options are validated now and
    /// on an error the previous options stay. The reload check is kept (see
    /// [`Session::set_reload_check`]).
    pub fn set_options(&self, plan: PlanOptions, copy: CopyOptions) -> Result<()> {
        copy.validate()?;
        let mut st = self.lock();
        st.options.plan = plan;
        st.options.copy = copy;
        Ok(())
    }

    /// Keep (or not) a checksum of every loaded extent at the next loads
    /// ([`LoadOptions::reload_check`]).
    pub fn set_reload_check(&self, on: bool) {
        self.lock().options.reload_check = on;
    }

    /// The load options in use.
    pub fn options(&self) -> LoadOptions {
        self.lock().options
    }

    /// Register a destination of your own (see [`Registry::register`]).
    pub fn register(&self, name: &str, ptr: u64, dtype: Dtype, shape: &[usize]) -> Result<()> {
        let mut st = self.lock();
        st.tensor_plan = None;
        Arc::make_mut(&mut st.registry).register(name, ptr, dtype, shape)
    }

    /// Declare `[ptr, ptr + bytes)` as device memory the caller owns outside
    /// the pool loads run on (see [`Registry::declare_foreign`]).
    pub fn declare_foreign(&self, ptr: u64, bytes: u64) -> Result<()> {
        Arc::make_mut(&mut self.lock().registry).declare_foreign(ptr, bytes)
    }

    /// The destinations the rules produce from this checkpoint (names,
    /// dtypes and shapes as the plan needs them: fused, sharded, padded).
    pub fn destination_specs(&self) -> Result<Vec<DestSpec>> {
        let mut st = self.lock();
        let rules = st.rules.clone();
        Plan::destinations(st.ckpt()?, &rules)
    }

    /// Allocate every destination of [`Session::destination_specs`] in
    /// `pool` under `tag` and register them; on failure nothing is
    /// registered and every block taken is freed again.
    pub fn allocate(&self, pool: &Pool, tag: TagId) -> Result<()> {
        crate::tag::check(tag)?;
        let mut st = self.lock();
        let rules = st.rules.clone();
        let specs = Plan::destinations(st.ckpt()?, &rules)?;
        st.tensor_plan = None;
        allocate_in_pool(Arc::make_mut(&mut st.registry), &specs, pool, tag)
    }

    /// Number of registered destinations.
    pub fn destination_count(&self) -> usize {
        self.lock().registry.len()
    }

    /// The registered destinations, in name order.
    pub fn destinations(&self) -> Vec<Destination> {
        self.lock().registry.iter().cloned().collect()
    }

    /// The registered destinations with their aliases and foreign ranges, as
    /// a load would write them (what an update writes through).
    pub fn registry(&self) -> Registry {
        Registry::clone(&self.lock().registry)
    }

    /// [`Session::registry`] without a copy: the registry as it is now,
    /// unchanged by later registrations (which copy it first).
    pub fn shared_registry(&self) -> Arc<Registry> {
        self.lock().registry.clone()
    }

    /// The plan that fills the registered destinations from `tensors` (any
    /// named tensors, each [`TensorInfo::shard`] and offset saying where its
    /// bytes are; see [`Plan::build_for`]) through the session's rules. The
    /// last such plan is kept: asked again for the same tensors and options
    /// while the rules and destinations stay, it is returned without being
    /// built again (an update that repeats every step plans once).
    pub fn plan_for(
        &self,
        tensors: &BTreeMap<String, TensorInfo>,
        options: &PlanOptions,
    ) -> Result<Arc<Plan>> {
        let mut st = self.lock();
        if let Some(c) = &st.tensor_plan {
            if c.options == *options && c.tensors == *tensors {
                return Ok(c.plan.clone());
            }
        }
        let plan = Arc::new(Plan::build_for(tensors, &st.rules, &st.registry, options)?);
        st.tensor_plan = Some(TensorPlan {
            tensors: tensors.clone(),
            options: *options,
            plan: plan.clone(),
        });
        Ok(plan)
    }

    /// The plan [`Session::plan_for`] keeps, when it was built with
    /// `options` for tensors `same` accepts: a caller that can compare its
    /// tensors with the kept ones finds the plan without building the set.
    pub fn kept_plan(
        &self,
        options: &PlanOptions,
        same: &dyn Fn(&BTreeMap<String, TensorInfo>) -> bool,
    ) -> Option<Arc<Plan>> {
        let st = self.lock();
        let kept = st.tensor_plan.as_ref()?;
        (kept.options == *options && same(&kept.tensors)).then(|| kept.plan.clone())
    }

    /// The destination registered under `name`.
    pub fn destination(&self, name: &str) -> Option<Destination> {
        self.lock().registry.get(name).cloned()
    }

    /// Build and check the plan against the registered destinations without
    /// writing anything.
    pub fn plan(&self) -> Result<PlanSummary> {
        let mut st = self.lock();
        let (rules, opts) = (st.rules.clone(), st.options.plan);
        st.ckpt()?;
        let ckpt = st.ckpt.as_ref().expect("opened above");
        let plan = Plan::build(ckpt, &rules, &st.registry, &opts)?;
        Ok(PlanSummary {
            extents: plan.extents.len() as u64,
            fills: plan.fills.len() as u64,
            src_bytes: plan.src_bytes(),
            dst_bytes: plan.dst_bytes(),
            sources: plan.sources.len() as u64,
            skipped: plan.skipped.len() as u64,
            missing: plan.missing.len() as u64,
            unexpected: plan.unexpected.len() as u64,
            destinations: st.registry.len() as u64,
        })
    }

    /// Load the checkpoint into the registered destinations in `pool` (see
    /// [`load_into_pool`]), calling `progress` on this thread as bytes land.
    /// The executed plan is kept ([`Session::last_result`]) and returned. The
    /// checkpoint is reopened by the next load.
    pub fn load(&self, pool: &Pool, progress: Option<Progress<'_>>) -> Result<Arc<ExecutedPlan>> {
        let mut st = self.lock();
        let ckpt = st.take_ckpt()?;
        let on_progress = |done: u64, total: u64| {
            if let Some(f) = progress {
                if f(done, total).is_break() {
                    self.cancel.store(true, Ordering::Release);
                }
            }
        };
        let ctl = Control {
            progress: Some(&on_progress),
            cancel: Some(&self.cancel),
        };
        let result = load_into_pool(pool, ckpt, &st.rules, &st.registry, &st.options, &ctl);
        consume_cancel(&result, &[self]);
        let executed = result?;
        st.executed = Some(executed.clone());
        Ok(executed)
    }

    /// Run `run` over several sessions, one per device, each with its pool:
    /// the sessions must have opened one checkpoint (the first session's is
    /// read, with its options), are locked in address order (two concurrent
    /// calls cannot deadlock) and held for the call, and each keeps its
    /// device's executed plan (`plans` finds them in what `run` returned, in
    /// session order). The first session's cancel request stops the run; the
    /// cancel rule applies to every session. A session listed twice is
    /// `InvalidArgument`.
    pub fn load_many<R>(
        sessions: &[&Session],
        pools: &[&Pool],
        what: &str,
        run: impl FnOnce(Checkpoint, &[PoolLoad<'_>], &LoadOptions, &Control<'_>) -> Result<R>,
        plans: impl Fn(&R) -> &[Arc<ExecutedPlan>],
    ) -> Result<R> {
        if sessions.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{what} needs at least one device"
            )));
        }
        if sessions.len() != pools.len() {
            return Err(Error::InvalidArgument(format!(
                "{what}: {} sessions for {} pools",
                sessions.len(),
                pools.len()
            )));
        }
        for (i, s) in sessions.iter().enumerate() {
            if sessions[..i].iter().any(|o| std::ptr::eq(*o, *s)) {
                return Err(Error::InvalidArgument(format!(
                    "loaders[{i}] is listed twice: give each device its own loader"
                )));
            }
        }
        let mut order: Vec<usize> = (0..sessions.len()).collect();
        order.sort_by_key(|&i| sessions[i] as *const Session as usize);
        let mut guards: Vec<Option<MutexGuard<'_, State>>> =
            (0..sessions.len()).map(|_| None).collect();
        for &i in &order {
            guards[i] = Some(sessions[i].lock());
        }
        let mut guards: Vec<_> = guards.into_iter().map(|g| g.expect("locked")).collect();
        let root = guards[0].path.clone();
        for (i, g) in guards.iter().enumerate() {
            if g.path != root {
                return Err(Error::InvalidArgument(format!(
                    "loaders[{i}] opened {}, loaders[0] {}: one checkpoint for all devices",
                    g.path.display(),
                    root.display()
                )));
            }
        }
        let ckpt = guards[0].take_ckpt()?;
        let options = guards[0].options;
        let ctl = Control {
            progress: None,
            cancel: Some(&sessions[0].cancel),
        };
        let targets: Vec<PoolLoad<'_>> = guards
            .iter()
            .zip(pools)
            .map(|(g, pool)| PoolLoad {
                pool,
                rules: &g.rules,
                registry: &g.registry,
            })
            .collect();
        let result = run(ckpt, &targets, &options, &ctl);
        drop(targets);
        consume_cancel(&result, sessions);
        let loaded = result?;
        for (g, plan) in guards.iter_mut().zip(plans(&loaded)) {
            g.executed = Some(plan.clone());
        }
        Ok(loaded)
    }

    /// Ask the running load of this session (or, when none runs, the next
    /// one) to stop with [`Error::Cancelled`]. Returns at once.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Whether a cancel request is pending.
    pub fn cancel_pending(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// Keep `executed` as the last successful load's result: the checkpoint
    /// reached this session's destinations by another path (a load
    /// broadcast from reader ranks).
    pub fn record_load(&self, executed: Arc<ExecutedPlan>) {
        self.lock().executed = Some(executed);
    }

    /// The executed plan of the last successful load.
    pub fn last_result(&self) -> Option<Arc<ExecutedPlan>> {
        self.lock().executed.clone()
    }

    fn last_or_err(&self) -> Result<Arc<ExecutedPlan>> {
        self.last_result()
            .ok_or_else(|| Error::InvalidState("no load has completed on this loader yet".into()))
    }

    /// The last load's statistics and plan summary as JSON;
    /// `InvalidState` before a load.
    pub fn result_json(&self) -> Result<String> {
        let e = self.last_or_err()?;
        let plan = e.plan();
        serde_json::to_string_pretty(&serde_json::json!({
            "stats": e.stats,
            "gbps": e.stats.gbps(),
            "sources": plan.sources.len(),
            "skipped": plan.skipped,
            "missing": plan.missing,
            "unexpected": plan.unexpected,
            "src_bytes": plan.src_bytes(),
            "dst_bytes": plan.dst_bytes(),
            "destinations": self.destination_count(),
        }))
        .map_err(|e| Error::InvalidState(format!("cannot serialize the load result: {e}")))
    }

    /// The statistics of the last successful load; `InvalidState` before one.
    pub fn stats(&self) -> Result<super::CopyStats> {
        Ok(self.last_or_err()?.stats)
    }
}
