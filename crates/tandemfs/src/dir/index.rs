//! The index above the regions: a B+-tree of 16-byte (hash, position) entries. Level-0 blocks
//! point at region dummies, higher levels at index blocks; an entry's hash is the lowest hash
//! of what it points at, exactly (kept so on every change), so a descent takes the last entry
//! whose hash is not above the wanted hash. There is no index while the directory is a single
//! region; the tree grows a level when its root splits and loses one when the root is left
//! with a single child, without a fixed limit.

use std::collections::BTreeSet;

use super::format::*;
use super::session::Session;
use crate::block::meta::BlockKind;
use crate::error::{Error, Result};

struct Step {
    block_number: u64,
    node: IndexNode,
    /// Entry of `node` the descent took.
    chosen: usize,
}

/// Descends from the root to the level-0 block for `hash`, root first.
fn descend(session: &mut Session, root: &DirRoot, hash: u32) -> Result<Vec<Step>> {
    assert!(root.index_depth > 0);
    let mut path = Vec::with_capacity(root.index_depth as usize);
    let mut block_number = root.index_root;
    for depth in 0..root.index_depth {
        let level = root.index_depth - 1 - depth;
        let node = session.index(block_number, level)?;
        let chosen = match node.entries.partition_point(|(entry_hash, _)| *entry_hash <= hash) {
            0 => {
                return Err(Error::corruption(format!(
                "directory index block {block_number}: lowest hash {:#x} above {hash:#x} reached through its parent",
                node.entries[0].0
            )))
            }
            after => after - 1,
        };
        if let Some(parent) = path.last() {
            let parent: &Step = parent;
            let expected = parent.node.entries[parent.chosen].0;
            if node.entries[0].0 != expected {
                return Err(Error::corruption(format!(
                    "directory index block {block_number}: lowest hash {:#x}, its parent says {expected:#x}",
                    node.entries[0].0
                )));
            }
        } else if node.entries[0].0 != 0 {
            return Err(Error::corruption(format!(
                "directory index root {block_number}: lowest hash {:#x}, not 0",
                node.entries[0].0
            )));
        }
        let target = node.entries[chosen].1;
        path.push(Step { block_number, node, chosen });
        block_number = target;
    }
    Ok(path)
}

/// The region `hash` falls in: (its lowest hash, the position of its dummy).
///
/// Read-only, so it searches each index block in place (a binary search over the entries, no
/// copy): an index block holds up to 254 entries, and decoding all of them on every lookup
/// cost more than the rest of the descent. What the search relies on is checked: the block's
/// header, the chosen entry and its right neighbour (the hash falls between them), and the
/// link to the parent. A block whose other entries are out of order can steer a lookup to a
/// wrong region; the walk from there finds the dummy or the list order wrong and reports
/// corruption, and `check` (fsck) and every change to the index validate blocks in full.
pub fn find_region(session: &mut Session, root: &DirRoot, hash: u32) -> Result<(u32, u64)> {
    region_and_next(session, root, hash).map(|(region_hash, position, _)| (region_hash, position))
}

/// As `find_region`, and the position of the next region's dummy when the level-0 index block
/// names it (None at the end of a block, and when there is no index: the caller walks instead).
pub fn region_and_next(session: &mut Session, root: &DirRoot, hash: u32) -> Result<(u32, u64, Option<u64>)> {
    if root.index_depth == 0 {
        return Ok((0, root.head_position(), None));
    }
    let mut block_number = root.index_root;
    let mut expected_lowest = 0u32;
    for depth in 0..root.index_depth {
        let level = root.index_depth - 1 - depth;
        let choice = session.search_index(block_number, level, hash, expected_lowest)?;
        if level == 0 {
            return Ok((choice.hash, choice.target, choice.next_target));
        }
        expected_lowest = choice.hash;
        block_number = choice.target;
    }
    unreachable!("the loop returns at level 0")
}

/// Keeps the copy of the index root in the first leaf's header in step (for fsck).
fn set_index_root(session: &mut Session, root: &mut DirRoot, block_number: u64, depth: u16) -> Result<()> {
    root.index_root = block_number;
    root.index_depth = depth;
    if depth > MAX_INDEX_DEPTH {
        return Err(Error::corruption(format!("directory index would grow to depth {depth}, past {MAX_INDEX_DEPTH}")));
    }
    write_u64(&mut session.leaf_mut(root.first_leaf)?[..], LEAF_INDEX_ROOT_OFFSET, block_number);
    Ok(())
}

/// Adds the region starting at `hash` (above 0) whose dummy is at `position`.
pub fn insert(session: &mut Session, root: &mut DirRoot, hash: u32, position: u64) -> Result<()> {
    assert!(hash > 0);
    if root.index_depth == 0 {
        let block_number = session.allocate(BlockKind::DirIndex, root.first_leaf)?;
        let node = IndexNode { level: 0, entries: vec![(0, root.head_position()), (hash, position)] };
        session.write_index(block_number, &node)?;
        root.index_block_count += 1;
        return set_index_root(session, root, block_number, 1);
    }
    let mut path = descend(session, root, hash)?;
    let mut new_entry = (hash, position);
    // Insert at each level from the bottom while blocks overflow.
    for level_index in (0..path.len()).rev() {
        let step = &mut path[level_index];
        if step.node.entries[step.chosen].0 == new_entry.0 {
            return Err(Error::corruption(format!("directory index: region {:#x} indexed twice", new_entry.0)));
        }
        step.node.entries.insert(step.chosen + 1, new_entry);
        if step.node.entries.len() <= INDEX_CAPACITY {
            session.write_index(step.block_number, &step.node)?;
            return Ok(());
        }
        let right_entries = step.node.entries.split_off(step.node.entries.len() / 2);
        let right = IndexNode { level: step.node.level, entries: right_entries };
        let right_block = session.allocate(BlockKind::DirIndex, step.block_number)?;
        root.index_block_count += 1;
        session.write_index(step.block_number, &step.node)?;
        session.write_index(right_block, &right)?;
        new_entry = (right.entries[0].0, right_block);
    }
    // The root split: a new root above the two halves.
    let old_root = path[0].block_number;
    let level = root.index_depth;
    let new_root = session.allocate(BlockKind::DirIndex, old_root)?;
    root.index_block_count += 1;
    session.write_index(new_root, &IndexNode { level, entries: vec![(0, old_root), new_entry] })?;
    set_index_root(session, root, new_root, root.index_depth + 1)
}

/// Drops the region starting at `hash` (above 0), rebalancing blocks that run low and
/// shortening the tree when the root has a single child.
pub fn remove(session: &mut Session, root: &mut DirRoot, hash: u32) -> Result<()> {
    assert!(hash > 0);
    if root.index_depth == 0 {
        return Err(Error::corruption(format!("directory region {hash:#x} has a dummy but there is no index")));
    }
    let mut path = descend(session, root, hash)?;
    {
        let last = path.last_mut().unwrap();
        if last.node.entries[last.chosen].0 != hash {
            return Err(Error::corruption(format!("directory index has no entry for region {hash:#x}")));
        }
        last.node.entries.remove(last.chosen);
    }
    for level_index in (1..path.len()).rev() {
        let (upper, lower) = path.split_at_mut(level_index);
        let step = &mut lower[0];
        let parent = &mut upper[level_index - 1];
        if step.node.entries.len() < INDEX_MIN_ENTRIES && parent.node.entries.len() > 1 {
            // Pair with the left sibling if there is one, else the right one.
            let (left_index, right_index) =
                if parent.chosen > 0 { (parent.chosen - 1, parent.chosen) } else { (parent.chosen, parent.chosen + 1) };
            let sibling_index = if left_index == parent.chosen { right_index } else { left_index };
            let sibling_block = parent.node.entries[sibling_index].1;
            let sibling = session.index(sibling_block, step.node.level)?;
            let (left_block, mut left, right_block, right) = if sibling_index == left_index {
                (sibling_block, sibling, step.block_number, std::mem::take(&mut step.node.entries))
            } else {
                (
                    step.block_number,
                    IndexNode { level: step.node.level, entries: std::mem::take(&mut step.node.entries) },
                    sibling_block,
                    sibling.entries,
                )
            };
            left.entries.extend(right);
            if left.entries.len() <= INDEX_CAPACITY {
                session.write_index(left_block, &left)?;
                session.free(right_block);
                decrement(&mut root.index_block_count, "index block count")?;
                parent.node.entries.remove(right_index);
            } else {
                let right = IndexNode { level: left.level, entries: left.entries.split_off(left.entries.len() / 2) };
                parent.node.entries[right_index].0 = right.entries[0].0;
                session.write_index(left_block, &left)?;
                session.write_index(right_block, &right)?;
            }
            parent.node.entries[left_index].0 = left.entries[0].0;
            // The parent's choice may have shifted; it is only used for its own parent's hash.
            parent.chosen = left_index;
        } else if step.node.entries.is_empty() {
            return Err(Error::corruption(format!("directory index block {} would be left empty", step.block_number)));
        } else {
            parent.node.entries[parent.chosen].0 = step.node.entries[0].0;
            session.write_index(step.block_number, &step.node)?;
        }
    }
    let top = &path[0];
    if top.node.entries.is_empty() || top.node.entries[0].0 != 0 {
        return Err(Error::corruption("directory index root lost the head region"));
    }
    session.write_index(top.block_number, &top.node)?;
    // Shorten the tree while the root has one child; drop it when only the head region is left.
    let mut node = top.node.clone();
    let mut block_number = top.block_number;
    let mut depth = root.index_depth;
    let mut rounds = 0;
    while node.entries.len() == 1 {
        rounds += 1;
        assert!(rounds <= MAX_INDEX_DEPTH as usize + 1);
        session.free(block_number);
        decrement(&mut root.index_block_count, "index block count")?;
        if depth == 1 {
            return set_index_root(session, root, 0, 0);
        }
        let child = node.entries[0].1;
        depth -= 1;
        node = session.index(child, depth - 1)?;
        block_number = child;
        set_index_root(session, root, child, depth)?;
    }
    Ok(())
}

/// Lowers a count of the root, which must not go below zero.
pub fn decrement(count: &mut u64, what: &str) -> Result<()> {
    *count = count.checked_sub(1).ok_or_else(|| Error::corruption(format!("directory root: {what} below zero")))?;
    Ok(())
}

/// Adds every index block reachable from the root to `blocks` (for destroy).
pub fn collect_blocks(session: &mut Session, root: &DirRoot, blocks: &mut BTreeSet<u64>) -> Result<()> {
    if root.index_depth == 0 {
        return Ok(());
    }
    let mut pending = vec![(root.index_root, root.index_depth - 1)];
    let mut budget = root.index_block_count.saturating_add(1);
    while let Some((block_number, level)) = pending.pop() {
        if budget == 0 || blocks.contains(&block_number) {
            return Err(Error::corruption("directory index reaches more blocks than its count, or one block twice"));
        }
        budget -= 1;
        // Only a block that reads as an index block of this directory is counted as its own.
        let node = session.index(block_number, level)?;
        blocks.insert(block_number);
        if level > 0 {
            pending.extend(node.entries.iter().map(|(_, child)| (*child, level - 1)));
        }
    }
    Ok(())
}
