//! One key slot: a 4096-byte block of the key-slot region that holds the volume's master key
//! wrapped (AES-256-GCM) under a key derived (Argon2id) from a passphrase or key file. The
//! byte table is in docs/FORMAT.md, *Key-slot region*.
//!
//! A slot is self-checksummed (CRC32C) so that a damaged slot is told apart from a slot that a
//! wrong secret does not open, and skipped while another slot still opens the volume. The
//! checksum guards against accidents only; a forger is stopped by the AEAD tag, whose
//! associated data binds the volume uuid and every header field (slot index, KDF cost, salt).

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};
use zeroize::Zeroizing;

use super::{KdfCost, MasterKey, Secret, MASTER_KEY_BYTES};
use crate::block::codec::{get_u32, put_u32};
use crate::block::meta::BLOCK_SIZE;
use crate::error::{Error, Result};

pub const SLOT_MAGIC: [u8; 8] = *b"TANDKEY\0";
pub const SLOT_VERSION: u32 = 1;
/// The only KDF: Argon2id, version 0x13.
pub const KDF_ARGON2ID: u32 = 1;
pub const SALT_BYTES: usize = 32;
pub const NONCE_BYTES: usize = 12;
pub const TAG_BYTES: usize = 16;

pub const OFFSET_MAGIC: usize = 0;
pub const OFFSET_VERSION: usize = 8;
pub const OFFSET_INDEX: usize = 12;
pub const OFFSET_KDF: usize = 16;
pub const OFFSET_MEMORY_KIB: usize = 20;
pub const OFFSET_ITERATIONS: usize = 24;
pub const OFFSET_LANES: usize = 28;
pub const OFFSET_SALT: usize = 32;
pub const OFFSET_NONCE: usize = 64;
/// The associated data covers the header, bytes 0..76 (magic to nonce).
pub const HEADER_BYTES: usize = 76;
pub const OFFSET_WRAPPED_KEY: usize = 76;
pub const OFFSET_TAG: usize = 140;
/// Bytes from here to the checksum are zero.
pub const USED_BYTES: usize = 156;
pub const OFFSET_CRC: usize = 4092;
const _: () = assert!(OFFSET_SALT + SALT_BYTES == OFFSET_NONCE);
const _: () = assert!(OFFSET_NONCE + NONCE_BYTES == HEADER_BYTES);
const _: () = assert!(OFFSET_WRAPPED_KEY + MASTER_KEY_BYTES == OFFSET_TAG);
const _: () = assert!(OFFSET_TAG + TAG_BYTES == USED_BYTES);

/// What a slot block holds.
#[derive(Debug)]
pub enum SlotContents {
    /// All zeros: never used, or wiped by a key removal.
    Empty,
    /// A wrapped master key.
    InUse(Slot),
    /// Neither: the checksum, magic or a field is wrong. Why, in words.
    Damaged(String),
}

/// A decoded slot in use.
#[derive(Debug, Clone)]
pub struct Slot {
    pub index: u32,
    pub cost: KdfCost,
    pub salt: [u8; SALT_BYTES],
    pub nonce: [u8; NONCE_BYTES],
    pub wrapped_key: [u8; MASTER_KEY_BYTES],
    pub tag: [u8; TAG_BYTES],
}

/// Decodes the slot block at `index` of the region. Never fails: what is wrong becomes
/// `Damaged`.
pub fn decode(bytes: &[u8; BLOCK_SIZE], index: u32) -> SlotContents {
    if bytes.iter().all(|byte| *byte == 0) {
        return SlotContents::Empty;
    }
    let stored_crc = get_u32(bytes, OFFSET_CRC);
    let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
    if crc != stored_crc {
        return SlotContents::Damaged(format!("checksum {stored_crc:#010x} stored, {crc:#010x} computed"));
    }
    if bytes[OFFSET_MAGIC..OFFSET_MAGIC + 8] != SLOT_MAGIC {
        return SlotContents::Damaged("no key-slot magic number".into());
    }
    let version = get_u32(bytes, OFFSET_VERSION);
    if version != SLOT_VERSION {
        return SlotContents::Damaged(format!("slot version {version} is not {SLOT_VERSION}"));
    }
    if get_u32(bytes, OFFSET_INDEX) != index {
        return SlotContents::Damaged(format!("records index {} at position {index}", get_u32(bytes, OFFSET_INDEX)));
    }
    if get_u32(bytes, OFFSET_KDF) != KDF_ARGON2ID {
        return SlotContents::Damaged(format!("unknown key derivation {}", get_u32(bytes, OFFSET_KDF)));
    }
    let cost = KdfCost {
        memory_kib: get_u32(bytes, OFFSET_MEMORY_KIB),
        iterations: get_u32(bytes, OFFSET_ITERATIONS),
        lanes: get_u32(bytes, OFFSET_LANES),
    };
    if let Err(problem) = cost.check() {
        return SlotContents::Damaged(problem);
    }
    if bytes[USED_BYTES..OFFSET_CRC].iter().any(|byte| *byte != 0) {
        return SlotContents::Damaged(format!("reserved bytes {USED_BYTES}..{OFFSET_CRC} are not zero"));
    }
    SlotContents::InUse(Slot {
        index,
        cost,
        salt: bytes[OFFSET_SALT..OFFSET_SALT + SALT_BYTES].try_into().unwrap(),
        nonce: bytes[OFFSET_NONCE..OFFSET_NONCE + NONCE_BYTES].try_into().unwrap(),
        wrapped_key: bytes[OFFSET_WRAPPED_KEY..OFFSET_WRAPPED_KEY + MASTER_KEY_BYTES].try_into().unwrap(),
        tag: bytes[OFFSET_TAG..OFFSET_TAG + TAG_BYTES].try_into().unwrap(),
    })
}

impl Slot {
    /// The slot's header bytes (0..76), which the AEAD authenticates with the volume uuid.
    fn header(&self) -> [u8; HEADER_BYTES] {
        let mut header = [0u8; HEADER_BYTES];
        header[OFFSET_MAGIC..OFFSET_MAGIC + 8].copy_from_slice(&SLOT_MAGIC);
        put_u32(&mut header, OFFSET_VERSION, SLOT_VERSION);
        put_u32(&mut header, OFFSET_INDEX, self.index);
        put_u32(&mut header, OFFSET_KDF, KDF_ARGON2ID);
        put_u32(&mut header, OFFSET_MEMORY_KIB, self.cost.memory_kib);
        put_u32(&mut header, OFFSET_ITERATIONS, self.cost.iterations);
        put_u32(&mut header, OFFSET_LANES, self.cost.lanes);
        header[OFFSET_SALT..OFFSET_SALT + SALT_BYTES].copy_from_slice(&self.salt);
        header[OFFSET_NONCE..OFFSET_NONCE + NONCE_BYTES].copy_from_slice(&self.nonce);
        header
    }

    pub fn encode(&self) -> Box<[u8; BLOCK_SIZE]> {
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        block[..HEADER_BYTES].copy_from_slice(&self.header());
        block[OFFSET_WRAPPED_KEY..OFFSET_WRAPPED_KEY + MASTER_KEY_BYTES].copy_from_slice(&self.wrapped_key);
        block[OFFSET_TAG..OFFSET_TAG + TAG_BYTES].copy_from_slice(&self.tag);
        let crc = tandem_accel::crc32c(0, &block[..OFFSET_CRC]);
        put_u32(&mut block[..], OFFSET_CRC, crc);
        block
    }

    /// Wraps `master` for slot `index` under a key derived from `secret` at `cost`, with a
    /// fresh salt and nonce.
    pub fn wrap(uuid: &[u8; 16], index: u32, secret: &Secret, cost: KdfCost, master: &MasterKey) -> Result<Slot> {
        let mut slot = Slot {
            index,
            cost,
            salt: super::random_array()?,
            nonce: super::random_array()?,
            wrapped_key: [0; MASTER_KEY_BYTES],
            tag: [0; TAG_BYTES],
        };
        let wrapping_key = derive(secret, &slot.cost, &slot.salt)?;
        let cipher = Aes256Gcm::new_from_slice(&wrapping_key[..]).expect("a 32-byte key");
        let mut buffer = Zeroizing::new(*master.bytes());
        let tag = cipher
            .encrypt_in_place_detached(
                Nonce::from_slice(&slot.nonce),
                &associated_data(uuid, &slot.header()),
                &mut buffer[..],
            )
            .map_err(|_| Error::invalid("AES-256-GCM refused to wrap the master key"))?;
        slot.wrapped_key.copy_from_slice(&buffer[..]);
        slot.tag.copy_from_slice(tag.as_slice());
        Ok(slot)
    }

    /// The master key, if `secret` opens this slot (the AEAD tag verifies); `None` otherwise.
    pub fn unwrap_key(&self, uuid: &[u8; 16], secret: &Secret) -> Result<Option<MasterKey>> {
        let wrapping_key = derive(secret, &self.cost, &self.salt)?;
        let cipher = Aes256Gcm::new_from_slice(&wrapping_key[..]).expect("a 32-byte key");
        let mut buffer = Zeroizing::new(self.wrapped_key);
        let opened = cipher.decrypt_in_place_detached(
            Nonce::from_slice(&self.nonce),
            &associated_data(uuid, &self.header()),
            &mut buffer[..],
            Tag::from_slice(&self.tag),
        );
        Ok(opened.ok().map(|()| MasterKey::from_bytes(&buffer)))
    }
}

/// The AEAD's associated data: the volume uuid, then the slot header (which names the slot
/// index), so a slot copied to another position or volume, or with its cost or salt changed,
/// does not open.
fn associated_data(uuid: &[u8; 16], header: &[u8; HEADER_BYTES]) -> [u8; 16 + HEADER_BYTES] {
    let mut data = [0u8; 16 + HEADER_BYTES];
    data[..16].copy_from_slice(uuid);
    data[16..].copy_from_slice(header);
    data
}

/// Argon2id of `secret` with `salt` at `cost`: the 32-byte key that wraps the master key.
fn derive(secret: &Secret, cost: &KdfCost, salt: &[u8; SALT_BYTES]) -> Result<Zeroizing<[u8; 32]>> {
    let mut key = Zeroizing::new([0u8; 32]);
    cost.argon2()?
        .hash_password_into(secret.bytes(), salt, &mut key[..])
        .map_err(|error| Error::invalid(format!("Argon2id key derivation failed: {error}")))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits() {
        const { assert!(USED_BYTES <= OFFSET_CRC) };
        assert_eq!(OFFSET_TAG + TAG_BYTES, 156);
    }

    #[test]
    fn wrap_open_and_refuse() {
        let master = MasterKey::random().unwrap();
        let secret = Secret::from_passphrase("correct horse".into()).unwrap();
        let uuid = [9u8; 16];
        let slot = Slot::wrap(&uuid, 3, &secret, KdfCost::for_tests(), &master).unwrap();
        let block = slot.encode();
        let SlotContents::InUse(decoded) = decode(&block, 3) else { panic!("slot does not decode") };
        assert_eq!(decoded.unwrap_key(&uuid, &secret).unwrap().unwrap().bytes(), master.bytes());
        let wrong = Secret::from_passphrase("wrong horse".into()).unwrap();
        assert!(decoded.unwrap_key(&uuid, &wrong).unwrap().is_none());
        assert!(decoded.unwrap_key(&[8; 16], &secret).unwrap().is_none(), "another volume's uuid");
        assert!(matches!(decode(&block, 4), SlotContents::Damaged(_)), "another position");
        // The checksum catches a flipped bit anywhere; a forger who fixes the checksum up is
        // stopped by the tag.
        for byte in [OFFSET_MEMORY_KIB, OFFSET_SALT, OFFSET_WRAPPED_KEY, OFFSET_TAG, 2000] {
            let mut damaged = block.clone();
            damaged[byte] ^= 1;
            assert!(matches!(decode(&damaged, 3), SlotContents::Damaged(_)), "byte {byte}");
            let crc = tandem_accel::crc32c(0, &damaged[..OFFSET_CRC]);
            put_u32(&mut damaged[..], OFFSET_CRC, crc);
            if let SlotContents::InUse(forged) = decode(&damaged, 3) {
                assert!(forged.unwrap_key(&uuid, &secret).unwrap().is_none(), "byte {byte}");
            }
        }
        assert!(matches!(decode(&[0u8; BLOCK_SIZE], 0), SlotContents::Empty));
    }
}
