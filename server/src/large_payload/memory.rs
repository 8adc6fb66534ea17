//! An in-memory [`ObjectStore`] for unit tests: objects in a map, and a
//! count of the calls made.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{ObjectError, ObjectStore, S3Object};

#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<HashMap<S3Object, Vec<u8>>>,
    gets: AtomicU64,
    /// A put of exactly these bytes fails.
    refused: Mutex<Option<Vec<u8>>>,
}

impl MemoryStore {
    pub fn insert(&self, object: &S3Object, bytes: impl Into<Vec<u8>>) {
        self.objects
            .lock()
            .unwrap()
            .insert(object.clone(), bytes.into());
    }

    pub fn object(&self, object: &S3Object) -> Option<Vec<u8>> {
        self.objects.lock().unwrap().get(object).cloned()
    }

    pub fn count(&self) -> usize {
        self.objects.lock().unwrap().len()
    }

    /// Puts of exactly `bytes` fail from now on.
    pub fn refuse_puts_of(&self, bytes: impl Into<Vec<u8>>) {
        *self.refused.lock().unwrap() = Some(bytes.into());
    }

    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::Relaxed)
    }
}

impl ObjectStore for MemoryStore {
    fn get(
        &self,
        object: &S3Object,
        max_bytes: u64,
    ) -> BoxFuture<'_, Result<Vec<u8>, ObjectError>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        let got = match self.object(object) {
            None => Err(ObjectError::Missing {
                object: object.to_string(),
                code: "NoSuchKey".into(),
            }),
            Some(b) if b.len() as u64 > max_bytes => Err(ObjectError::TooLarge {
                object: object.to_string(),
                size: b.len() as u64,
                max: max_bytes,
            }),
            Some(b) => Ok(b),
        };
        async move { got }.boxed()
    }

    fn put(&self, object: &S3Object, bytes: Vec<u8>) -> BoxFuture<'_, Result<(), ObjectError>> {
        if self.refused.lock().unwrap().as_ref() == Some(&bytes) {
            let refused = ObjectError::Failed {
                operation: "PutObject",
                object: object.to_string(),
                code: "InternalError".into(),
                message: "refused by the test".into(),
            };
            return async { Err(refused) }.boxed();
        }
        self.insert(object, bytes);
        async { Ok(()) }.boxed()
    }

    fn delete(&self, object: &S3Object) -> BoxFuture<'_, Result<(), ObjectError>> {
        self.objects.lock().unwrap().remove(object);
        async { Ok(()) }.boxed()
    }
}
