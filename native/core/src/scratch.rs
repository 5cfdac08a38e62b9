//! What other modules derive from the session once per cycle, kept on it under their own types
//! (as kai_ray/core/scratch.py keys it): the session holds the packing policies' memo or the
//! pending-job order without depending on the modules that define them.

use std::any::{Any, TypeId};

use rustc_hash::FxHashMap;

#[derive(Default)]
pub struct Scratch(FxHashMap<TypeId, Box<dyn Any + Send>>);

impl Scratch {
    /// The value of type `T`, taken out for the caller to change and `put` back; None when there
    /// is none yet.
    pub fn take<T: Any + Send>(&mut self) -> Option<Box<T>> {
        let value = self.0.remove(&TypeId::of::<T>())?;
        Some(value.downcast::<T>().expect("a scratch value is keyed by its own type"))
    }

    pub fn put<T: Any + Send>(&mut self, value: Box<T>) {
        self.0.insert(TypeId::of::<T>(), value);
    }

    pub fn get<T: Any + Send>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>()).and_then(|value| value.downcast_ref::<T>())
    }
}
