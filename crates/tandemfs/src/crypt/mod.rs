//! `crypt`: encrypted volumes (docs/ENCRYPTION.md).
//!
//! An encrypted volume (superblock bit `FEATURE_INCOMPAT_ENCRYPTED`) keeps every block except
//! the two superblocks, the MMP block and the key-slot region in AES-256-XTS, one 4096-byte data
//! unit per block with the block number as tweak ([`EncryptedDevice`]). The 64-byte XTS master
//! key is random; the key-slot region holds it wrapped (AES-256-GCM) under keys derived
//! (Argon2id) from passphrases or key files, one per slot ([`slot`]).
//!
//! Every opener calls [`unlock`], which gives back the device itself for a plain volume and an
//! `EncryptedDevice` for an encrypted one; everything above it reads and writes plaintext.
//! Unlocking only reads: a wrong key writes nothing.

mod device;
pub mod slot;
mod tail_cache;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use zeroize::Zeroizing;

pub use device::EncryptedDevice;
use slot::{Slot, SlotContents};

use crate::block::meta::{BLOCK_SIZE, BLOCK_SIZE_U64};
use crate::block::superblock::Superblock;
use crate::device::Device;
use crate::error::{Error, Result};

/// Slots in the key-slot region of an encrypted volume, one block each (a torn write of one
/// slot cannot touch another).
pub const KEY_SLOT_COUNT: usize = 8;
/// Bytes of the master key: the AES-256-XTS data key, then the tweak key.
pub const MASTER_KEY_BYTES: usize = 64;
/// Bytes of a key file: exactly this many (`head -c 64 /dev/urandom > FILE`).
pub const KEY_FILE_BYTES: usize = 64;
/// Longest passphrase accepted (Argon2 takes any length; this bounds what a prompt reads).
pub const PASSPHRASE_BYTES_MAX: usize = 4096;
/// Bounds on a KDF cost read from a slot, so that a damaged slot cannot make unlock allocate
/// without limit or spin for hours: at most 4 GiB, 64 passes, 16 lanes.
pub const KDF_MEMORY_KIB_MAX: u32 = 4 << 20;
pub const KDF_ITERATIONS_MAX: u32 = 64;
pub const KDF_LANES_MAX: u32 = 16;

/// A passphrase or a key file's bytes. Wiped when dropped; never printed.
#[derive(Clone)]
pub struct Secret {
    bytes: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Secret(..)")
    }
}

impl Secret {
    /// A passphrase; an empty one is refused.
    pub fn from_passphrase(passphrase: String) -> Result<Secret> {
        let bytes = Zeroizing::new(passphrase.into_bytes());
        if bytes.is_empty() {
            return Err(Error::Key("the passphrase is empty".into()));
        }
        if bytes.len() > PASSPHRASE_BYTES_MAX {
            return Err(Error::Key(format!("the passphrase is longer than {PASSPHRASE_BYTES_MAX} bytes")));
        }
        Ok(Secret { bytes })
    }

    /// The contents of a key file, which must hold exactly `KEY_FILE_BYTES` bytes.
    pub fn from_key_file(path: &Path) -> Result<Secret> {
        use std::io::Read;
        let shown = path.display();
        let file = std::fs::File::open(path).map_err(|error| Error::Key(format!("key file {shown}: {error}")))?;
        // One byte more than a key file holds tells a long file from a right one without
        // reading all of it.
        let mut bytes = Zeroizing::new(Vec::with_capacity(KEY_FILE_BYTES + 1));
        file.take(KEY_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| Error::Key(format!("key file {shown}: {error}")))?;
        if bytes.len() != KEY_FILE_BYTES {
            let held = if bytes.len() > KEY_FILE_BYTES { "more than 64".to_string() } else { bytes.len().to_string() };
            return Err(Error::Key(format!(
                "key file {shown} holds {held} bytes; a key file holds exactly {KEY_FILE_BYTES} (head -c {KEY_FILE_BYTES} /dev/urandom > FILE)"
            )));
        }
        Ok(Secret { bytes })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The random master key of an encrypted volume. Wiped when dropped; never printed.
pub struct MasterKey {
    bytes: Zeroizing<[u8; MASTER_KEY_BYTES]>,
}

impl MasterKey {
    pub fn random() -> Result<MasterKey> {
        let mut bytes = Zeroizing::new([0u8; MASTER_KEY_BYTES]);
        getrandom::getrandom(&mut bytes[..])
            .map_err(|error| Error::invalid(format!("no random bytes for a master key: {error}")))?;
        Ok(MasterKey { bytes })
    }

    fn from_bytes(bytes: &[u8; MASTER_KEY_BYTES]) -> MasterKey {
        MasterKey { bytes: Zeroizing::new(*bytes) }
    }

    fn bytes(&self) -> &[u8; MASTER_KEY_BYTES] {
        &self.bytes
    }

    fn xts_key(&self) -> tandem_accel::XtsKey {
        tandem_accel::XtsKey::new(&self.bytes)
    }
}

/// Random bytes from the operating system (salts, nonces).
fn random_array<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes).map_err(|error| Error::invalid(format!("no random bytes: {error}")))?;
    Ok(bytes)
}

/// Argon2id cost of one key slot: what guessing a passphrase costs an attacker per guess, and
/// what unlocking costs once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfCost {
    pub memory_kib: u32,
    pub iterations: u32,
    pub lanes: u32,
}

impl KdfCost {
    /// Memory calibration starts from and stays within (64 MiB to 1 GiB; 8 MiB on a slow
    /// machine that cannot do one pass over 64 MiB in the target time).
    const CALIBRATION_START_KIB: u32 = 64 << 10;
    const CALIBRATION_MEMORY_MIN_KIB: u32 = 8 << 10;
    const CALIBRATION_MEMORY_MAX_KIB: u32 = 1 << 20;

    /// A cost that takes about `target_ms` on this machine: the memory grows (to 1 GiB) before
    /// the passes do, since memory is what makes guessing dear on GPUs. One lane: the crate
    /// computes lanes one after another here, so more lanes would only cost time.
    pub fn calibrate(target_ms: u64) -> Result<KdfCost> {
        assert!(target_ms > 0);
        let mut cost = KdfCost { memory_kib: KdfCost::CALIBRATION_START_KIB, iterations: 1, lanes: 1 };
        let mut elapsed_ms = cost.measure_ms()?;
        // Each loop halves or doubles the memory between its bounds: at most 7 rounds each.
        while elapsed_ms > target_ms && cost.memory_kib > KdfCost::CALIBRATION_MEMORY_MIN_KIB {
            cost.memory_kib /= 2;
            elapsed_ms = cost.measure_ms()?;
        }
        while elapsed_ms * 2 <= target_ms && cost.memory_kib < KdfCost::CALIBRATION_MEMORY_MAX_KIB {
            cost.memory_kib *= 2;
            elapsed_ms = cost.measure_ms()?;
        }
        cost.iterations = (target_ms / elapsed_ms.max(1)).clamp(1, KDF_ITERATIONS_MAX as u64) as u32;
        Ok(cost)
    }

    /// A cheap cost for tests (64 KiB, one pass): a slot opens in about a millisecond.
    pub fn for_tests() -> KdfCost {
        KdfCost { memory_kib: 64, iterations: 1, lanes: 1 }
    }

    fn measure_ms(&self) -> Result<u64> {
        let started = Instant::now();
        let mut output = Zeroizing::new([0u8; 32]);
        self.argon2()?
            .hash_password_into(b"calibration passphrase", &[0u8; slot::SALT_BYTES], &mut output[..])
            .map_err(|error| Error::invalid(format!("Argon2id calibration failed: {error}")))?;
        Ok(started.elapsed().as_millis() as u64)
    }

    /// Whether the cost is within the bounds a slot may record.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !(1..=KDF_LANES_MAX).contains(&self.lanes)
            || !(1..=KDF_ITERATIONS_MAX).contains(&self.iterations)
            || self.memory_kib < 8 * self.lanes
            || self.memory_kib > KDF_MEMORY_KIB_MAX
        {
            return Err(format!(
                "Argon2id cost {} KiB, {} passes, {} lanes is outside 8 KiB per lane..{KDF_MEMORY_KIB_MAX} KiB, 1..={KDF_ITERATIONS_MAX} passes, 1..={KDF_LANES_MAX} lanes",
                self.memory_kib, self.iterations, self.lanes
            ));
        }
        Ok(())
    }

    fn argon2(&self) -> Result<argon2::Argon2<'static>> {
        self.check().map_err(Error::invalid)?;
        let params = argon2::Params::new(self.memory_kib, self.iterations, self.lanes, Some(32))
            .map_err(|error| Error::invalid(format!("Argon2id parameters: {error}")))?;
        Ok(argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params))
    }
}

/// How `FormatOptions` asks for an encrypted volume: the first slot's secret and its cost.
#[derive(Debug, Clone)]
pub struct Encryption {
    pub secret: Secret,
    pub cost: KdfCost,
}

/// One slot of the key-slot region, for `tandem stat` and `tandem key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlotInfo {
    pub index: usize,
    pub in_use: bool,
    /// The slot's Argon2id cost, when it is in use.
    pub cost: Option<KdfCost>,
    /// What is wrong with a damaged slot (not in use, not empty).
    pub damage: Option<String>,
}

/// What `unlock_with_report` did.
pub struct Unlocked {
    /// The device to use from now on: the device itself (plain volume) or an `EncryptedDevice`.
    pub device: Arc<dyn Device>,
    /// The slot that opened the volume; `None` for a plain volume.
    pub slot: Option<usize>,
    /// Slots that are damaged (index and why): worth a warning, since only the others open
    /// the volume.
    pub damaged_slots: Vec<(usize, String)>,
}

/// Whether the volume on `device` is encrypted (reads the superblock only).
pub fn is_encrypted(device: &dyn Device) -> Result<bool> {
    Ok(Superblock::read_best(device)?.is_encrypted())
}

/// The one entry every opener uses: the device itself for a plain volume (or one unlocked
/// already), an `EncryptedDevice` for an encrypted one that `key` opens. Reads only.
pub fn unlock(device: Arc<dyn Device>, key: Option<&Secret>) -> Result<Arc<dyn Device>> {
    Ok(unlock_with_report(device, key)?.device)
}

/// `unlock`, also saying which slot opened the volume and which slots are damaged.
pub fn unlock_with_report(device: Arc<dyn Device>, key: Option<&Secret>) -> Result<Unlocked> {
    if device.decrypts() {
        // Unlocked already (the command line unlocks first, to warn about damaged slots).
        return Ok(Unlocked { device, slot: None, damaged_slots: Vec::new() });
    }
    let superblock = Superblock::read_best(device.as_ref())?;
    if !superblock.is_encrypted() {
        return Ok(Unlocked { device, slot: None, damaged_slots: Vec::new() });
    }
    let Some(secret) = key else {
        return Err(Error::Key("volume is encrypted: give --key-file FILE or its passphrase".into()));
    };
    let (opened, slots) = open_master_key(device.as_ref(), &superblock, secret)?;
    let damaged_slots = damaged(&slots);
    let (index, master) = opened;
    let encrypted = EncryptedDevice::new(device, &superblock, &master);
    Ok(Unlocked { device: Arc::new(encrypted), slot: Some(index), damaged_slots })
}

/// Writes the key-slot region of a new encrypted volume (slot 0 wraps `master` for `secret`,
/// the others empty) and flushes. `superblock` is the new volume's, with its uuid.
pub fn format_key_slots(device: &dyn Device, superblock: &Superblock, encryption: &Encryption) -> Result<MasterKey> {
    assert!(superblock.is_encrypted());
    assert_eq!(superblock.key_slot_blocks, KEY_SLOT_COUNT as u64);
    encryption.cost.check().map_err(Error::invalid)?;
    let master = MasterKey::random()?;
    let first = Slot::wrap(&superblock.uuid, 0, &encryption.secret, encryption.cost, &master)?;
    let mut region = vec![0u8; KEY_SLOT_COUNT * BLOCK_SIZE];
    region[..BLOCK_SIZE].copy_from_slice(&first.encode()[..]);
    device.write_at(superblock.key_slot_start * BLOCK_SIZE_U64, &region)?;
    device.flush()?;
    Ok(master)
}

/// Adds a slot for `new`, given a secret that opens the volume; returns its index.
pub fn add_key(device: &dyn Device, existing: &Secret, new: &Secret, cost: KdfCost) -> Result<usize> {
    cost.check().map_err(Error::invalid)?;
    let superblock = encrypted_superblock(device)?;
    let ((_, master), slots) = open_master_key(device, &superblock, existing)?;
    let index = free_slot(&slots)?;
    write_slot(device, &superblock, index, &Slot::wrap(&superblock.uuid, index as u32, new, cost, &master)?)?;
    Ok(index)
}

/// Wipes the slot `secret` opens; returns its index. Removing the last slot that opens the
/// volume is refused: the volume would be lost.
pub fn remove_key(device: &dyn Device, secret: &Secret) -> Result<usize> {
    let superblock = encrypted_superblock(device)?;
    let ((index, _), slots) = open_master_key(device, &superblock, secret)?;
    let others = slots.iter().enumerate().filter(|(other, contents)| *other != index && is_in_use(contents)).count();
    if others == 0 {
        return Err(Error::Key(format!(
            "key slot {index} is the only slot in use: removing it would lose the volume (add another key first)"
        )));
    }
    wipe_slot(device, &superblock, index)?;
    Ok(index)
}

/// Replaces the slot `old` opens by a slot for `new`: the new slot is written and flushed
/// before the old one is wiped, so some slot opens the volume at every moment. Returns the
/// new slot's index.
pub fn change_key(device: &dyn Device, old: &Secret, new: &Secret, cost: KdfCost) -> Result<usize> {
    cost.check().map_err(Error::invalid)?;
    let superblock = encrypted_superblock(device)?;
    let ((old_index, master), slots) = open_master_key(device, &superblock, old)?;
    let new_index = free_slot(&slots)?;
    write_slot(device, &superblock, new_index, &Slot::wrap(&superblock.uuid, new_index as u32, new, cost, &master)?)?;
    wipe_slot(device, &superblock, old_index)?;
    Ok(new_index)
}

/// Every slot of the region: in use (with its cost), empty, or damaged.
pub fn key_slots(device: &dyn Device) -> Result<Vec<KeySlotInfo>> {
    let superblock = encrypted_superblock(device)?;
    let slots = read_slots(device, &superblock)?;
    Ok(slots
        .iter()
        .enumerate()
        .map(|(index, contents)| match contents {
            SlotContents::Empty => KeySlotInfo { index, in_use: false, cost: None, damage: None },
            SlotContents::InUse(slot) => KeySlotInfo { index, in_use: true, cost: Some(slot.cost), damage: None },
            SlotContents::Damaged(why) => KeySlotInfo { index, in_use: false, cost: None, damage: Some(why.clone()) },
        })
        .collect())
}

fn encrypted_superblock(device: &dyn Device) -> Result<Superblock> {
    let superblock = Superblock::read_best(device)?;
    if !superblock.is_encrypted() {
        return Err(Error::Key("volume is not encrypted: it has no key slots".into()));
    }
    Ok(superblock)
}

fn read_slots(device: &dyn Device, superblock: &Superblock) -> Result<Vec<SlotContents>> {
    assert_eq!(superblock.key_slot_blocks, KEY_SLOT_COUNT as u64, "validated with the superblock");
    let mut region = vec![0u8; KEY_SLOT_COUNT * BLOCK_SIZE];
    device.read_at(superblock.key_slot_start * BLOCK_SIZE_U64, &mut region)?;
    Ok(region
        .chunks_exact(BLOCK_SIZE)
        .enumerate()
        .map(|(index, bytes)| slot::decode(bytes.try_into().unwrap(), index as u32))
        .collect())
}

fn is_in_use(contents: &SlotContents) -> bool {
    matches!(contents, SlotContents::InUse(_))
}

fn damaged(slots: &[SlotContents]) -> Vec<(usize, String)> {
    slots
        .iter()
        .enumerate()
        .filter_map(|(index, contents)| match contents {
            SlotContents::Damaged(why) => Some((index, why.clone())),
            _ => None,
        })
        .collect()
}

/// The slot that opened the volume and the master key, and every slot as read.
type Opened = ((usize, MasterKey), Vec<SlotContents>);

/// Tries `secret` on every slot in use, in order (at most `KEY_SLOT_COUNT` derivations); the
/// first whose tag verifies gives the master key.
fn open_master_key(device: &dyn Device, superblock: &Superblock, secret: &Secret) -> Result<Opened> {
    let slots = read_slots(device, superblock)?;
    for (index, contents) in slots.iter().enumerate() {
        if let SlotContents::InUse(slot) = contents {
            if let Some(master) = slot.unwrap_key(&superblock.uuid, secret)? {
                return Ok(((index, master), slots));
            }
        }
    }
    let damaged = damaged(&slots);
    let in_use = slots.iter().filter(|contents| is_in_use(contents)).count();
    let mut message = format!("wrong passphrase or key file: none of the {in_use} key slots in use opens the volume");
    if !damaged.is_empty() {
        let list: Vec<String> = damaged.iter().map(|(index, why)| format!("slot {index} ({why})")).collect();
        message.push_str(&format!("; damaged: {}", list.join(", ")));
    }
    Err(Error::Key(message))
}

/// The first empty slot, else the first damaged one (which opens nothing anyway).
fn free_slot(slots: &[SlotContents]) -> Result<usize> {
    let empty = slots.iter().position(|contents| matches!(contents, SlotContents::Empty));
    let damaged = slots.iter().position(|contents| matches!(contents, SlotContents::Damaged(_)));
    empty
        .or(damaged)
        .ok_or_else(|| Error::Key(format!("all {KEY_SLOT_COUNT} key slots are in use: remove a key first")))
}

fn write_slot(device: &dyn Device, superblock: &Superblock, index: usize, slot: &Slot) -> Result<()> {
    assert!(index < KEY_SLOT_COUNT);
    device.write_at((superblock.key_slot_start + index as u64) * BLOCK_SIZE_U64, &slot.encode()[..])?;
    device.flush()
}

/// Overwrites a slot with zeros (empty), so that its wrapped key is gone from the medium (as
/// far as the medium overwrites in place), and flushes.
fn wipe_slot(device: &dyn Device, superblock: &Superblock, index: usize) -> Result<()> {
    assert!(index < KEY_SLOT_COUNT);
    device.write_at((superblock.key_slot_start + index as u64) * BLOCK_SIZE_U64, &[0u8; BLOCK_SIZE])?;
    device.flush()
}
