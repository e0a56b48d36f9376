//! A vector in chunks that its copies share: cloning it copies the chunk
//! pointers only, and replacing an element copies that element's chunk
//! only while another copy shares it. The snapshot keeps its services so
//! (successive snapshots share every service but the changed ones) and the
//! control plane the endpoints' statuses of the last compilation.
//!
//! As one vector of `Arc`s, each copy would take and later drop a reference
//! to every element: two passes over 10,000 scattered reference counts, most
//! of the time of a single endpoint change with 10,000 services. A lookup
//! reads one chunk pointer more than a flat vector would.

use std::sync::Arc;

/// Elements in chunks of this many (a power of two).
const CHUNK_BITS: u32 = 6;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A vector in shared chunks (see the module's documentation).
#[derive(Clone)]
pub struct Chunked<T> {
    chunks: Vec<Arc<[T]>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked { chunks: Vec::new(), len: 0 }
    }
}

impl<T> Chunked<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element at index `i`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i >> CHUNK_BITS)?.get(i & (CHUNK - 1))
    }

    /// Every element, by index.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// The chunks, in order (to see what two copies share).
    pub fn chunks(&self) -> &[Arc<[T]>] {
        &self.chunks
    }

    /// Binary search over elements sorted by `f`'s order, as
    /// [`slice::binary_search_by`].
    pub fn binary_search_by<F: FnMut(&T) -> std::cmp::Ordering>(&self, mut f: F) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let Some(s) = self.get(mid) else { return Err(lo) };
            match f(s) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }
}

impl<T: Clone> Chunked<T> {
    /// The element at index `i`, to replace: its chunk is copied first
    /// when another copy shares it.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        Arc::make_mut(self.chunks.get_mut(i >> CHUNK_BITS)?).get_mut(i & (CHUNK - 1))
    }
}

impl<T> From<Vec<T>> for Chunked<T> {
    fn from(v: Vec<T>) -> Chunked<T> {
        let len = v.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        let mut rest = v.into_iter();
        loop {
            let chunk: Arc<[T]> = rest.by_ref().take(CHUNK).collect();
            if chunk.is_empty() {
                break;
            }
            chunks.push(chunk);
        }
        Chunked { chunks, len }
    }
}

impl<T> std::ops::Index<usize> for Chunked<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(s) => s,
            None => panic!("index {i} out of range ({} elements)", self.len),
        }
    }
}

impl<T: PartialEq> PartialEq for Chunked<T> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Chunked<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_shares_every_chunk_but_the_changed_ones() {
        for n in [0usize, 1, 63, 64, 65, 200] {
            let v: Vec<Arc<usize>> = (0..n).map(Arc::new).collect();
            let a = Chunked::from(v.clone());
            assert_eq!(a.len(), n);
            assert_eq!(a.chunks().len(), n.div_ceil(CHUNK));
            assert!(a.iter().map(|x| **x).eq(0..n), "every element, in order");
            assert_eq!(a.get(n), None);
            if n == 0 {
                continue;
            }
            let mut b = a.clone();
            let i = n * 2 / 3;
            *b.get_mut(i).unwrap() = Arc::new(1000);
            assert_eq!(*a[i], i, "the original is unchanged");
            assert_eq!(*b[i], 1000);
            assert!(a != b);
            for c in 0..a.chunks().len() {
                assert_eq!(Arc::ptr_eq(&a.chunks()[c], &b.chunks()[c]), c != i >> CHUNK_BITS, "chunk {c} of {n}");
            }
            *b.get_mut(i).unwrap() = Arc::clone(&v[i]);
            assert!(a == b, "equal by content");
            assert_eq!(b.binary_search_by(|x| (**x).cmp(&i)), Ok(i));
        }
    }
}
