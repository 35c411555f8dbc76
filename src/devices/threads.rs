//! Work spread over one thread per device (or per anything), joined in order.

use crate::error::{panic_message, Error, Result};

/// Run `work(k)` for k in `0..n` at once, one thread each, and collect the
/// results in order; a thread that panicked gives [`Error::Panic`] naming `what`.
pub(crate) fn on_threads<T: Send>(
    n: usize,
    what: &str,
    work: impl Fn(usize) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> = (0..n).map(|k| s.spawn(move || work(k))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|p| {
                    Err(Error::Panic(format!("{what}: {}", panic_message(&*p))))
                })
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn on_threads_keeps_order_and_turns_a_panic_into_an_error() {
        let r = on_threads(4, "a test thread", |k| {
            if k == 2 {
                panic!("thread two");
            }
            Ok(k * 10)
        });
        assert_eq!(r.len(), 4);
        assert_eq!(*r[3].as_ref().unwrap(), 30);
        let e = r[2].as_ref().unwrap_err();
        assert_eq!(e.status(), Status::Panic);
        assert!(e.to_string().contains("a test thread: thread two"), "{e}");
    }
}
