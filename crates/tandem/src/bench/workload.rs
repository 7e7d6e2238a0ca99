//! The metadata workload shared by `bench meta` and `bench mount`, written once against a small
//! trait so tandemfs (library calls) and kernel file systems (system calls) run exactly the same
//! sequence of operations on the same names.

use std::ffi::{CStr, CString};
use std::time::Instant;

/// Operations a target must offer. Directory indices: 0 is "flat", 1..=N are the tree's
/// directories, in the order `set_up_directories` made them.
pub trait MetadataTarget {
    /// Makes "flat", "tree" and `tree_directory_count` directories under "tree" (not timed).
    fn set_up_directories(&mut self, tree_directory_count: usize) -> Result<(), String>;
    /// Removes what `set_up_directories` made (not timed).
    fn tear_down_directories(&mut self) -> Result<(), String>;
    fn create(&mut self, directory: usize, name: &CStr) -> Result<(), String>;
    fn stat(&mut self, directory: usize, name: &CStr) -> Result<(), String>;
    fn unlink(&mut self, directory: usize, name: &CStr) -> Result<(), String>;
    /// Creates an empty file in the root for appends (not timed).
    fn open_append(&mut self, name: &CStr) -> Result<(), String>;
    /// Appends `data` at the end of the append file and makes it durable (write + fsync).
    fn append_durably(&mut self, data: &[u8]) -> Result<(), String>;
    /// Closes and removes the append file (not timed).
    fn close_append(&mut self, name: &CStr) -> Result<(), String>;
}

/// The measured operations, in the order they run and are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    CreateFlat,
    StatFlat,
    UnlinkFlat,
    CreateTree,
    StatTree,
    UnlinkTree,
    Append256,
    Append4096,
}

impl Operation {
    pub const ALL: [Operation; 8] = [
        Operation::CreateFlat,
        Operation::StatFlat,
        Operation::UnlinkFlat,
        Operation::CreateTree,
        Operation::StatTree,
        Operation::UnlinkTree,
        Operation::Append256,
        Operation::Append4096,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Operation::CreateFlat => "create, one directory",
            Operation::StatFlat => "stat, one directory",
            Operation::UnlinkFlat => "unlink, one directory",
            Operation::CreateTree => "create, tree",
            Operation::StatTree => "stat, tree",
            Operation::UnlinkTree => "unlink, tree",
            Operation::Append256 => "append 256 B + fsync",
            Operation::Append4096 => "append 4 KiB + fsync",
        }
    }

    /// The speed-up over ext4 the project aims for, where it set one.
    pub fn target_ratio(self) -> Option<f64> {
        match self {
            Operation::CreateFlat | Operation::CreateTree => Some(3.0),
            Operation::StatFlat | Operation::StatTree => Some(5.0),
            Operation::UnlinkFlat | Operation::UnlinkTree => Some(3.0),
            Operation::Append256 => Some(50.0),
            Operation::Append4096 => None,
        }
    }
}

/// How much work one round does.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadSize {
    pub files: usize,
    pub tree_directories: usize,
    pub appends: usize,
}

impl WorkloadSize {
    pub fn new(files: usize, appends: usize) -> WorkloadSize {
        // 100 directories as the brief's tree, fewer for tiny runs so each holds some files.
        let tree_directories = (files / 10).clamp(1, 100);
        WorkloadSize { files, tree_directories, appends }
    }
    /// A tenth of the work, for the warm-up round.
    pub fn warm_up(self) -> WorkloadSize {
        WorkloadSize::new((self.files / 10).max(100), (self.appends / 10).max(10))
    }
}

/// Seconds taken by each operation of one round, with its operation count.
pub type RoundResult = Vec<(Operation, u64, f64)>;

/// Fixed names ("f0000000", ...), made before timing so formatting never counts.
pub fn file_names(count: usize) -> Vec<CString> {
    (0..count).map(|index| CString::new(format!("f{index:07}")).expect("no interior zero byte")).collect()
}

fn timed(
    results: &mut RoundResult,
    operation: Operation,
    count: usize,
    mut body: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    crate::interrupt::check()?;
    let started = Instant::now();
    body().map_err(|error| format!("{}: {error}", operation.label()))?;
    results.push((operation, count as u64, started.elapsed().as_secs_f64()));
    Ok(())
}

/// Applies `action` to every file of the tree: directory by directory, names in order.
fn for_each_tree_file(
    target: &mut dyn MetadataTarget,
    directories: usize,
    names: &[CString],
    action: fn(&mut dyn MetadataTarget, usize, &CStr) -> Result<(), String>,
) -> Result<(), String> {
    for directory in 1..=directories {
        for name in names {
            action(target, directory, name)?;
        }
    }
    Ok(())
}

/// Runs one full round and leaves the target as empty as it found it.
pub fn run_round(
    target: &mut dyn MetadataTarget,
    size: WorkloadSize,
    names: &[CString],
) -> Result<RoundResult, String> {
    let mut results = RoundResult::new();
    let files = &names[..size.files];
    let per_directory = (size.files / size.tree_directories).max(1);
    let tree_count = per_directory * size.tree_directories;
    target.set_up_directories(size.tree_directories)?;

    timed(&mut results, Operation::CreateFlat, files.len(), || {
        files.iter().try_for_each(|name| target.create(0, name))
    })?;
    timed(&mut results, Operation::StatFlat, files.len(), || files.iter().try_for_each(|name| target.stat(0, name)))?;
    timed(&mut results, Operation::UnlinkFlat, files.len(), || {
        files.iter().try_for_each(|name| target.unlink(0, name))
    })?;

    let tree_names = &names[..per_directory];
    let directories = size.tree_directories;
    timed(&mut results, Operation::CreateTree, tree_count, || {
        for_each_tree_file(target, directories, tree_names, |target, directory, name| target.create(directory, name))
    })?;
    timed(&mut results, Operation::StatTree, tree_count, || {
        for_each_tree_file(target, directories, tree_names, |target, directory, name| target.stat(directory, name))
    })?;
    timed(&mut results, Operation::UnlinkTree, tree_count, || {
        for_each_tree_file(target, directories, tree_names, |target, directory, name| target.unlink(directory, name))
    })?;
    target.tear_down_directories()?;

    for (operation, length) in [(Operation::Append256, 256usize), (Operation::Append4096, 4096)] {
        let name = CString::new(format!("append-{length}")).expect("no interior zero byte");
        let data = vec![0xa5u8; length];
        target.open_append(&name)?;
        timed(&mut results, operation, size.appends, || {
            (0..size.appends).try_for_each(|_| target.append_durably(&data))
        })?;
        target.close_append(&name)?;
    }
    Ok(results)
}

/// Median seconds per operation over rounds (three rounds: the middle one; two: the faster).
pub fn median_per_operation(rounds: &[RoundResult]) -> Vec<(Operation, f64)> {
    Operation::ALL
        .iter()
        .filter_map(|&operation| {
            let mut per_operation: Vec<f64> = rounds
                .iter()
                .filter_map(|round| round.iter().find(|(measured, _, _)| *measured == operation))
                .filter(|(_, count, _)| *count > 0)
                .map(|(_, count, seconds)| seconds / *count as f64)
                .collect();
            if per_operation.is_empty() {
                return None;
            }
            per_operation.sort_by(f64::total_cmp);
            Some((operation, per_operation[(per_operation.len() - 1) / 2]))
        })
        .collect()
}

/// Runs a warm-up round and `rounds` measured rounds, printing progress to stderr.
pub fn measure(
    target: &mut dyn MetadataTarget,
    size: WorkloadSize,
    rounds: usize,
    label: &str,
) -> Result<Vec<(Operation, f64)>, String> {
    let names = file_names(size.files.max(size.warm_up().files));
    eprintln!("  {label}: warm-up");
    run_round(target, size.warm_up(), &names)?;
    let mut results = Vec::new();
    for round in 1..=rounds {
        eprintln!("  {label}: round {round} of {rounds}");
        results.push(run_round(target, size, &names)?);
    }
    Ok(median_per_operation(&results))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_middle_round() {
        let rounds = vec![
            vec![(Operation::CreateFlat, 10, 3.0)],
            vec![(Operation::CreateFlat, 10, 1.0)],
            vec![(Operation::CreateFlat, 10, 2.0)],
        ];
        let medians = median_per_operation(&rounds);
        assert_eq!(medians, vec![(Operation::CreateFlat, 0.2)]);
    }

    #[test]
    fn names_are_fixed_and_sortable() {
        let names = file_names(3);
        assert_eq!(names[2].to_str().unwrap(), "f0000002");
    }
}
