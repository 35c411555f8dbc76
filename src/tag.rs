//! Tags: named groups of allocations ("weights", "kv_cache", any user name).
//!
//! Sleep and wake act per tag, so the pool never lets blocks of two tags share
//! a segment. Which tag an allocation gets is decided here:
//!
//! - a process-wide registry maps names to [`TagId`]s (`"default"` is [`TagId::DEFAULT`]);
//! - each thread has a scope stack: [`scope`] pushes and returns an RAII guard,
//!   [`push`]/[`pop`] do the same for C callers;
//! - threads with an empty stack (a framework's own worker threads) use the
//!   process-wide current tag, set with [`set_process_default`].
//!
//! [`current`] is the top of the calling thread's stack, or the process default.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// The name of [`TagId::DEFAULT`].
pub const DEFAULT_NAME: &str = "default";
/// Longest accepted tag name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// A registered tag. Cheap to copy; the name is in the process-wide registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TagId(pub u32);

impl TagId {
    /// The tag allocations get when nobody chose one.
    pub const DEFAULT: TagId = TagId(0);

    /// The registered name, or `None` for an id that was never handed out.
    pub fn name(self) -> Option<String> {
        registry().names.get(self.0 as usize).cloned()
    }
}

impl fmt::Display for TagId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "'{n}'"),
            None => write!(f, "<unregistered tag #{}>", self.0),
        }
    }
}

#[derive(Debug)]
struct Registry {
    names: Vec<String>,
    ids: HashMap<String, TagId>,
}

fn registry_lock() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut ids = HashMap::new();
        ids.insert(DEFAULT_NAME.to_owned(), TagId::DEFAULT);
        Mutex::new(Registry {
            names: vec![DEFAULT_NAME.to_owned()],
            ids,
        })
    })
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // The registry only ever grows by whole entries; a panic elsewhere cannot
    // leave it half-updated, so a poisoned lock is still usable.
    registry_lock().lock().unwrap_or_else(|p| p.into_inner())
}

fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument("tag name must not be empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "tag name `{name}` is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(Error::InvalidArgument(format!(
            "tag name {name:?} contains control characters"
        )));
    }
    Ok(())
}

/// The id of tag `name`, registering it on first use. The same name always
/// gives the same id for the life of the process.
pub fn id(name: &str) -> Result<TagId> {
    validate_name(name)?;
    let mut r = registry();
    if let Some(&t) = r.ids.get(name) {
        return Ok(t);
    }
    let t = TagId(u32::try_from(r.names.len()).map_err(|_| {
        Error::InvalidArgument(format!("cannot register tag `{name}`: too many tags"))
    })?);
    r.names.push(name.to_owned());
    r.ids.insert(name.to_owned(), t);
    REGISTERED.store(r.names.len() as u32, Ordering::Release);
    Ok(t)
}

/// The id of an already registered tag, without registering it.
pub fn lookup(name: &str) -> Option<TagId> {
    registry().ids.get(name).copied()
}

/// `Ok` when `tag` was handed out by [`id`]; `Error::UnknownTag` otherwise.
pub fn check(tag: TagId) -> Result<()> {
    // Lock-free: every allocation checks its tag.
    if tag.0 < REGISTERED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(Error::UnknownTag(format!(
            "#{} (never returned by tag::id)",
            tag.0
        )))
    }
}

/// The registered name of `tag`, or a placeholder naming its number.
pub fn name_of(tag: TagId) -> String {
    tag.name().unwrap_or_else(|| format!("#{}", tag.0))
}

/// Number of registered tags ("default" is always there); ids below it are valid.
static REGISTERED: AtomicU32 = AtomicU32::new(1);

static PROCESS_DEFAULT: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static STACK: RefCell<Vec<TagId>> = const { RefCell::new(Vec::new()) };
}

/// Set the tag used by threads whose scope stack is empty.
pub fn set_process_default(tag: TagId) -> Result<()> {
    check(tag)?;
    PROCESS_DEFAULT.store(tag.0, Ordering::Relaxed);
    Ok(())
}

/// The tag used by threads whose scope stack is empty.
pub fn process_default() -> TagId {
    TagId(PROCESS_DEFAULT.load(Ordering::Relaxed))
}

/// The tag new allocations on this thread get: the innermost scope, else the process default.
pub fn current() -> TagId {
    STACK
        .with(|s| s.borrow().last().copied())
        .unwrap_or_else(process_default)
}

/// How many scopes are open on this thread.
pub fn depth() -> usize {
    STACK.with(|s| s.borrow().len())
}

/// Open a scope on this thread (for C callers; Rust code prefers [`scope`]).
pub fn push(tag: TagId) -> Result<()> {
    check(tag)?;
    STACK.with(|s| s.borrow_mut().push(tag));
    Ok(())
}

/// Close the innermost scope on this thread and return its tag.
/// An error, changing nothing, when no scope is open.
pub fn pop() -> Result<TagId> {
    STACK.with(|s| s.borrow_mut().pop()).ok_or_else(|| {
        Error::InvalidState(
            "tag pop without a matching push: this thread has no open tag scope".into(),
        )
    })
}

/// Open a scope on this thread; it closes when the guard drops (also while unwinding).
pub fn scope(tag: TagId) -> Result<ScopeGuard> {
    push(tag)?;
    Ok(ScopeGuard {
        depth: depth(),
        _not_send: PhantomData,
    })
}

/// Closes its scope on drop. Bound to the thread that opened it.
#[must_use = "the scope closes as soon as the guard is dropped"]
#[derive(Debug)]
pub struct ScopeGuard {
    /// Stack length right after our push: dropping truncates to one below it,
    /// which also closes scopes pushed inside ours and never popped.
    depth: usize,
    _not_send: PhantomData<*const ()>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        STACK.with(|s| s.borrow_mut().truncate(self.depth - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(id("").is_err());
        assert!(id(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(id("a\nb").is_err());
        assert_eq!(id(DEFAULT_NAME).unwrap(), TagId::DEFAULT);
    }

    #[test]
    fn unregistered_ids_are_rejected() {
        assert!(matches!(push(TagId(u32::MAX)), Err(Error::UnknownTag(_))));
        assert_eq!(depth(), 0);
    }
}
