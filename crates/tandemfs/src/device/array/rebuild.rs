//! Rebuilding a missing slot onto a new device (docs/RAID.md, *Rebuild*), offline or while the
//! array serves a mounted volume. A cursor walks the stripes, each rebuilt under its stripe
//! lock; a write to a stripe the cursor has passed reaches the new device too, one to a stripe
//! not yet rebuilt only the present members (the rebuild reads it from them later). The new
//! device has no member header until all of it is written and flushed; then the headers of
//! every member, the new one included, name it in one event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::assemble::{random_uuid, Member};
use super::header::{DATA_START_BYTES, HEADER_BYTES};
use super::{ArrayDevice, RebuildProgress, STRIPE_LOCK_COUNT};
use crate::device::Device;
use crate::error::{Error, Result};

/// A rebuild in progress.
pub(super) struct Target {
    slot: usize,
    device: Arc<dyn Device>,
    name: String,
    /// Stripes below this are rebuilt on `device`, and writes to them go there too. It moves
    /// only under the lock of the stripe it passes, so a write holding that lock sees it settled.
    cursor: AtomicU64,
    /// The first write to `device` that failed: the rebuild stops with it, the array goes on.
    failed: Mutex<Option<String>>,
    started: Instant,
}

impl ArrayDevice {
    /// A write of `slot`'s bytes while it is missing: kept on the rebuild's new device when the
    /// rebuild of that slot has passed the stripe (the caller holds the stripe's lock).
    pub(super) fn write_rebuilt(&self, slot: usize, offset: u64, data: &[u8]) {
        if offset < DATA_START_BYTES {
            // Intent records: the new member's area stays zero until it has joined.
            return;
        }
        let rebuilding = self.rebuilding.read();
        let Some(target) = rebuilding.as_ref().filter(|target| target.slot == slot) else { return };
        let stripe = (offset - DATA_START_BYTES) / self.geometry.stripe_unit_bytes;
        if stripe >= target.cursor.load(Ordering::Acquire) {
            return;
        }
        match target.device.write_at(offset, data) {
            Ok(()) => {
                self.counters[slot].writes.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                self.counters[slot].write_errors.fetch_add(1, Ordering::Relaxed);
                target.failed.lock().get_or_insert_with(|| format!("{}: {error}", target.name));
            }
        }
    }

    /// How far the running rebuild has come, if one runs.
    pub(super) fn rebuild_progress(&self) -> Option<RebuildProgress> {
        let rebuilding = self.rebuilding.read();
        let target = rebuilding.as_ref()?;
        let unit_bytes = self.geometry.stripe_unit_bytes;
        Some(RebuildProgress {
            slot: target.slot,
            name: target.name.clone(),
            done_bytes: target.cursor.load(Ordering::Acquire) * unit_bytes,
            total_bytes: self.geometry.stripe_count * unit_bytes,
            elapsed_ms: u64::try_from(target.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Rebuilds missing `slot` onto `replacement` with nothing else using the array (offline),
    /// and returns the array with the new member in. See [`ArrayDevice::rebuild`].
    pub fn rebuild_onto(
        self,
        slot: usize,
        replacement: Member,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ArrayDevice> {
        self.rebuild(slot, replacement, &mut |done, total| {
            progress(done, total);
            true
        })?;
        Ok(self)
    }

    /// Rebuilds missing `slot` onto `replacement`, while the array is in use or not: every
    /// stripe's unit of that slot rebuilt from k others and written, the replacement flushed
    /// with the array, and only then a new member uuid for the slot and its missing bit cleared
    /// in every member's header, the replacement's too. A crash before leaves the replacement
    /// without a header (no member) and the array as it was. `progress(stripes_done,
    /// stripe_count)` is called after each stripe; when it answers false the rebuild stops,
    /// the array as it was. Bad input is refused with nothing written.
    pub fn rebuild(&self, slot: usize, replacement: Member, progress: &mut dyn FnMut(u64, u64) -> bool) -> Result<()> {
        let target = self.start_rebuild(slot, replacement)?;
        let result = self.rebuild_stripes(&target, progress).and_then(|()| self.take_in(&target));
        let mut rebuilding = self.rebuilding.write();
        if rebuilding.as_ref().is_some_and(|running| Arc::ptr_eq(running, &target)) {
            *rebuilding = None;
        }
        result
    }

    /// Checks the request and installs the rebuild (nothing written yet).
    fn start_rebuild(&self, slot: usize, replacement: Member) -> Result<Arc<Target>> {
        let geometry = self.geometry;
        if slot >= geometry.member_count || !self.missing[slot].load(Ordering::Acquire) {
            let missing: Vec<String> = self.missing_slots().iter().map(usize::to_string).collect();
            return Err(Error::invalid(format!(
                "slot {slot} is not a missing slot of this array (missing: {})",
                if missing.is_empty() { "none".to_string() } else { missing.join(", ") }
            )));
        }
        let needed = DATA_START_BYTES + geometry.stripe_count * geometry.stripe_unit_bytes;
        if replacement.device.size_bytes() < needed || replacement.device.is_read_only() {
            return Err(Error::invalid(format!(
                "{} cannot take slot {slot}: it needs {needed} writable bytes, it has {}{}",
                replacement.name,
                replacement.device.size_bytes(),
                if replacement.device.is_read_only() { " read-only" } else { "" }
            )));
        }
        let same = |device: &Arc<dyn Device>| std::ptr::addr_eq(Arc::as_ptr(device), Arc::as_ptr(&replacement.device));
        if self.member_devices().iter().any(same) {
            return Err(Error::invalid(format!("{} is already a member of this array", replacement.name)));
        }
        self.check_enough()?;
        let mut rebuilding = self.rebuilding.write();
        if let Some(running) = rebuilding.as_ref() {
            return Err(Error::invalid(format!(
                "a rebuild of slot {} onto {} is already running",
                running.slot, running.name
            )));
        }
        let target = Arc::new(Target {
            slot,
            device: replacement.device,
            name: replacement.name,
            cursor: AtomicU64::new(0),
            failed: Mutex::new(None),
            started: Instant::now(),
        });
        *rebuilding = Some(target.clone());
        Ok(target)
    }

    /// The rebuild proper: the replacement's headers and intent area zeroed (so a stop or a
    /// crash leaves it claiming nothing), then every stripe's unit rebuilt and the cursor moved.
    fn rebuild_stripes(&self, target: &Target, progress: &mut dyn FnMut(u64, u64) -> bool) -> Result<()> {
        let geometry = self.geometry;
        let failed = |why: String| Error::Io {
            operation: "rebuild",
            offset: 0,
            source: std::io::Error::other(format!("the new member failed: {why}")),
        };
        let zeros = vec![0u8; DATA_START_BYTES as usize];
        target
            .device
            .write_at(0, &zeros)
            .and_then(|()| target.device.flush())
            .map_err(|error| failed(error.to_string()))?;
        debug_assert!(DATA_START_BYTES as usize >= 2 * HEADER_BYTES);
        for stripe in 0..geometry.stripe_count {
            {
                let _stripe = self.stripe_locks[(stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
                let shard = (0..geometry.member_count)
                    .find(|&shard| geometry.slot(stripe, shard) == target.slot)
                    .expect("a slot per shard");
                let unit = self.read_rows_retrying(stripe, 0..geometry.stripe_unit_bytes, &[shard])?;
                target
                    .device
                    .write_at(geometry.member_offset(stripe, 0), &unit[0])
                    .map_err(|error| failed(error.to_string()))?;
                self.counters[target.slot].writes.fetch_add(1, Ordering::Relaxed);
                target.cursor.store(stripe + 1, Ordering::Release);
            }
            if let Some(why) = target.failed.lock().clone() {
                return Err(failed(why));
            }
            if !progress(stripe + 1, geometry.stripe_count) {
                return Err(Error::invalid(format!("the rebuild of slot {} was stopped", target.slot)));
            }
        }
        Ok(())
    }

    /// The rebuilt member joins: with flushes held off (reads wait), the epoch goes home (to
    /// the new member too: the cursor has passed every stripe) and every member and the new
    /// one are flushed; then the slot is present and the headers name it, written twice so
    /// that both copies do.
    fn take_in(&self, target: &Target) -> Result<()> {
        let slot = target.slot;
        let member_uuid = random_uuid()?;
        let _home = self.home.write();
        let epoch = std::mem::take(&mut *self.epoch.lock());
        self.check_enough()?;
        if !epoch.is_empty() {
            self.write_epoch(epoch)?;
        }
        self.flush_members()?;
        if let Err(error) = target.device.flush() {
            target.failed.lock().get_or_insert_with(|| format!("{}: {error}", target.name));
        }
        if let Some(why) = target.failed.lock().clone() {
            return Err(Error::Io {
                operation: "rebuild",
                offset: 0,
                source: std::io::Error::other(format!("the new member failed: {why}")),
            });
        }
        let mut header = self.header.lock();
        header.member_uuids[slot] = member_uuid;
        *self.members[slot].write() = Some(target.device.clone());
        self.names.write()[slot] = target.name.clone();
        self.missing_reasons.lock()[slot] = None;
        *self.rebuilding.write() = None;
        if self.missing[slot].swap(false, Ordering::AcqRel) {
            self.missing_count.fetch_sub(1, Ordering::AcqRel);
        }
        self.write_headers(&mut header)?;
        self.write_headers(&mut header)?;
        drop(header);
        // The new member's record area is zero: the next epoch with home writes writes a record
        // on every member, its number going on from the others'.
        let mut intent = self.intent.lock();
        intent.retire_pending = true;
        intent.durable_bitmap = None;
        Ok(())
    }
}
