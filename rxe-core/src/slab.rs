//! A tiny slab: numbered objects with reuse of freed numbers. Numbers start at 1 so that 0
//! never names an object.

#[derive(Debug)]
pub struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
    max: u32,
}

impl<T> Slab<T> {
    pub fn new(max: u32) -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            max,
        }
    }
    pub fn insert(&mut self, v: T) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            self.items[i as usize - 1] = Some(v);
            return Some(i);
        }
        if self.items.len() as u32 >= self.max {
            return None;
        }
        self.items.push(Some(v));
        Some(self.items.len() as u32)
    }
    pub fn get(&self, id: u32) -> Option<&T> {
        self.items.get((id as usize).wrapping_sub(1))?.as_ref()
    }
    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.items.get_mut((id as usize).wrapping_sub(1))?.as_mut()
    }
    pub fn remove(&mut self, id: u32) -> Option<T> {
        let v = self.items.get_mut((id as usize).wrapping_sub(1))?.take()?;
        self.free.push(id);
        Some(v)
    }
}
