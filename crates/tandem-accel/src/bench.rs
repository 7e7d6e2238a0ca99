//! `tandem bench services`: throughput and host CPU time of every service on every engine,
//! beside OpenSSL and ISA-L measured in the same run.

use crate::engine::{CpuEngine, Engine, Sectors};
use crate::reed_solomon::ReedSolomon;
use crate::xts::{Direction, XtsKey, SECTOR_SIZE_BYTES};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

pub const HELP: &str = "\
tandem bench services [options]

Measures CRC32C, AES-256-XTS and Reed-Solomon on the CPU engine (one thread and all
threads) and on every GPU engine found (host memory in and out through pinned buffers, and
data already resident on the GPU), beside `openssl speed -evp aes-256-xts` and ISA-L
(libisal.so.2, when installed). Throughput is in GB/s (10^9 bytes per second); CPU time is
host CPU seconds (user + system, all threads of this process) per GB processed.

Options:
  --size BYTES          bytes per operation on the CPU (suffix K, M, G; default 64M)
  --gpu-size BYTES      bytes per operation on the GPU (default 1G)
  --services LIST       comma list of crc32c,xts,rs (default all)
  --rs-shapes LIST      comma list of k+m shapes (default 8+2)
  --threads N           threads for the all-threads rows (default every core)
  --seconds S           minimum measuring time per row (default 0.5)
  --gpu / --no-gpu      require / skip the GPU engine (default: use it when found)
  --gpus N              use only the first N GPUs for the host in/out rows (default all)
  --no-openssl          skip the OpenSSL comparison
  --no-isal             skip the ISA-L comparison
  --help                this text
";

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub cpu_bytes: usize,
    pub gpu_bytes: usize,
    pub services: Vec<String>,
    pub reed_solomon_shapes: Vec<(usize, usize)>,
    pub threads: usize,
    pub minimum_seconds: f64,
    pub gpu: Option<bool>,
    pub gpu_count: Option<usize>,
    pub openssl: bool,
    pub isal: bool,
}

fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (number, multiplier) = match text.chars().last() {
        Some('K') | Some('k') => (&text[..text.len() - 1], 1usize << 10),
        Some('M') | Some('m') => (&text[..text.len() - 1], 1 << 20),
        Some('G') | Some('g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    number.parse::<usize>().map(|value| value * multiplier).map_err(|_| format!("bad size '{text}'"))
}

pub fn parse_shape(text: &str) -> Result<(usize, usize), String> {
    let (data, parity) = text.split_once('+').ok_or_else(|| format!("bad shape '{text}', want k+m"))?;
    let data = data.trim().parse().map_err(|_| format!("bad shape '{text}'"))?;
    let parity = parity.trim().parse().map_err(|_| format!("bad shape '{text}'"))?;
    Ok((data, parity))
}

impl BenchConfig {
    pub fn parse(args: &[String]) -> Result<Option<Self>, String> {
        let mut config = BenchConfig {
            cpu_bytes: 64 << 20,
            gpu_bytes: 1 << 30,
            services: vec!["crc32c".into(), "xts".into(), "rs".into()],
            reed_solomon_shapes: vec![(8, 2)],
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            minimum_seconds: 0.5,
            gpu: None,
            gpu_count: None,
            openssl: true,
            isal: true,
        };
        let mut iterator = args.iter();
        while let Some(argument) = iterator.next() {
            let mut value = || iterator.next().cloned().ok_or_else(|| format!("{argument} needs a value"));
            match argument.as_str() {
                "--help" | "-h" => return Ok(None),
                "--size" => config.cpu_bytes = parse_bytes(&value()?)?,
                "--gpu-size" => config.gpu_bytes = parse_bytes(&value()?)?,
                "--services" => config.services = value()?.split(',').map(|s| s.trim().to_string()).collect(),
                "--rs-shapes" => {
                    config.reed_solomon_shapes = value()?.split(',').map(parse_shape).collect::<Result<_, _>>()?
                }
                "--threads" => config.threads = value()?.parse().map_err(|_| "bad --threads".to_string())?,
                "--seconds" => config.minimum_seconds = value()?.parse().map_err(|_| "bad --seconds".to_string())?,
                "--gpu" => config.gpu = Some(true),
                "--no-gpu" => config.gpu = Some(false),
                "--gpus" => config.gpu_count = Some(value()?.parse().map_err(|_| "bad --gpus".to_string())?),
                "--no-openssl" => config.openssl = false,
                "--no-isal" => config.isal = false,
                other => return Err(format!("unknown option '{other}'\n\n{HELP}")),
            }
        }
        for service in &config.services {
            if !["crc32c", "xts", "rs"].contains(&service.as_str()) {
                return Err(format!("unknown service '{service}'"));
            }
        }
        if config.cpu_bytes < SECTOR_SIZE_BYTES || config.gpu_bytes < SECTOR_SIZE_BYTES || config.threads == 0 {
            return Err("sizes must be at least 4K and threads at least 1".into());
        }
        config.cpu_bytes -= config.cpu_bytes % SECTOR_SIZE_BYTES;
        config.gpu_bytes -= config.gpu_bytes % SECTOR_SIZE_BYTES;
        Ok(Some(config))
    }
}

/// CPU seconds (user + system) this process has used so far, all threads together.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct we own.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 * 1e-6;
        seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }
}

/// One measured row.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub gigabytes_per_second: f64,
    pub cpu_seconds_per_gigabyte: f64,
}

/// Runs `operation` (which processes `bytes`) once to warm up, then repeatedly for at least
/// `minimum_seconds`.
pub fn measure(bytes: usize, minimum_seconds: f64, mut operation: impl FnMut()) -> Measurement {
    operation();
    let start = Instant::now();
    let cpu_start = process_cpu_seconds();
    let mut runs = 0u64;
    while runs < 2 || start.elapsed() < Duration::from_secs_f64(minimum_seconds) {
        operation();
        runs += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_start;
    let gigabytes = bytes as f64 * runs as f64 / 1e9;
    Measurement { gigabytes_per_second: gigabytes / seconds, cpu_seconds_per_gigabyte: cpu / gigabytes }
}

pub fn random_bytes(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut output = vec![0u8; length];
    for chunk in output.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let bytes = state.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    output
}

/// Rows of the report: service, engine, measurement, note.
pub struct Report {
    rows: Vec<(String, String, Option<Measurement>, String)>,
    notes: Vec<String>,
}

impl Report {
    pub fn new() -> Self {
        Self { rows: Vec::new(), notes: Vec::new() }
    }
    pub fn row(&mut self, service: &str, engine: &str, measurement: Option<Measurement>, note: impl Into<String>) {
        self.rows.push((service.to_string(), engine.to_string(), measurement, note.into()));
    }
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }
    pub fn find(&self, service: &str, engine: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|(s, e, m, _)| s == service && e == engine && m.is_some())
            .map(|(_, _, m, _)| m.as_ref().unwrap().gigabytes_per_second)
    }
    pub fn render(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(text, "{:<28} {:<34} {:>10} {:>12}  note", "service", "engine", "GB/s", "CPU s/GB");
        for (service, engine, measurement, note) in &self.rows {
            match measurement {
                Some(m) => {
                    let _ = writeln!(
                        text,
                        "{:<28} {:<34} {:>10.2} {:>12.4}  {}",
                        service, engine, m.gigabytes_per_second, m.cpu_seconds_per_gigabyte, note
                    );
                }
                None => {
                    let _ = writeln!(text, "{:<28} {:<34} {:>10} {:>12}  {}", service, engine, "-", "-", note);
                }
            }
        }
        for note in &self.notes {
            let _ = writeln!(text, "{note}");
        }
        text
    }
}

impl Default for Report {
    fn default() -> Self {
        Self::new()
    }
}

/// OpenSSL's own figure for AES-256-XTS over 4 KiB buffers, in GB/s (`threads` > 1 uses -multi).
pub fn openssl_xts(threads: usize, seconds: u32) -> Result<Measurement, String> {
    let mut command = std::process::Command::new("openssl");
    command.args(["speed", "-evp", "aes-256-xts", "-bytes", "4096", "-seconds", &seconds.to_string()]);
    if threads > 1 {
        command.args(["-multi", &threads.to_string()]);
    }
    let children_before = children_cpu_seconds();
    let output = command.output().map_err(|error| format!("cannot run openssl: {error}"))?;
    let children_cpu = children_cpu_seconds() - children_before;
    let text = String::from_utf8_lossy(&output.stdout);
    // The table's last line for the cipher ends with the 4096-byte figure in 1000s of bytes/s.
    let line = text
        .lines()
        .rev()
        .find(|line| line.to_ascii_lowercase().contains("aes-256-xts") && line.trim_end().ends_with('k'))
        .ok_or_else(|| format!("no AES-256-XTS line in openssl output: {}", text.trim()))?;
    let figure = line.split_whitespace().last().unwrap().trim_end_matches('k');
    let rate = figure
        .parse::<f64>()
        .map(|thousands| thousands * 1000.0 / 1e9)
        .map_err(|_| format!("cannot parse '{line}'"))?;
    // Every process measured for `seconds` at the aggregate rate; the children's CPU time
    // includes their start-up, so this slightly overstates OpenSSL's cost.
    let gigabytes = rate * seconds as f64;
    Ok(Measurement { gigabytes_per_second: rate, cpu_seconds_per_gigabyte: children_cpu / gigabytes })
}

/// CPU seconds used by finished child processes (user + system).
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct we own.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 * 1e-6;
        seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }
}

pub fn run_services(args: &[String]) -> Result<String, String> {
    let config = match BenchConfig::parse(args)? {
        Some(config) => config,
        None => return Ok(HELP.to_string()),
    };
    let mut report = Report::new();
    let started = Instant::now();
    report.note(format!(
        "host: {} cores available, {} threads for the all-threads rows; CPU engine: {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        config.threads,
        CpuEngine::new(config.threads).name()
    ));
    let isal = if config.isal { crate::isal::Isal::load() } else { Err("skipped (--no-isal)".into()) };
    if let Err(reason) = &isal {
        report.note(format!("ISA-L: {reason}"));
    }
    let gpu = if config.gpu == Some(false) {
        report.note("GPU: skipped (--no-gpu)");
        None
    } else {
        match crate::cuda::CudaSystem::open() {
            Ok(mut system) => {
                if let Some(count) = config.gpu_count {
                    system.devices.truncate(count.max(1));
                }
                Some(system)
            }
            Err(reason) => {
                if config.gpu == Some(true) {
                    return Err(format!("--gpu given but no GPU engine: {reason}"));
                }
                report.note(format!("GPU: none ({reason}); CPU engine only"));
                None
            }
        }
    };
    let engines = [(1usize, "cpu 1 thread".to_string()), (config.threads, format!("cpu {} threads", config.threads))];

    // First, while the package is cool: the per-core comparisons that the targets are about.
    per_core_comparisons(&config, isal.as_ref().ok(), &mut report);

    if config.services.iter().any(|s| s == "crc32c") {
        let data = random_bytes(config.cpu_bytes, 1);
        let blocks = data.len() / SECTOR_SIZE_BYTES;
        for (threads, label) in &engines {
            let engine = CpuEngine::new(*threads);
            let mut checksums = vec![0u32; blocks];
            let m = measure(data.len(), config.minimum_seconds, || {
                engine.crc32c_blocks(&data, SECTOR_SIZE_BYTES, &mut checksums).unwrap()
            });
            report.row("crc32c 4K blocks", label, Some(m), "");
            let m = measure(data.len(), config.minimum_seconds, || {
                std::hint::black_box(engine.crc32c(0, &data).unwrap());
            });
            report.row("crc32c buffer", label, Some(m), "");
        }
        if let Ok(isal) = &isal {
            let m = measure(data.len(), config.minimum_seconds, || {
                for block in data.chunks_exact(SECTOR_SIZE_BYTES) {
                    std::hint::black_box(isal.crc32c(0, block));
                }
            });
            let agrees = data
                .chunks_exact(SECTOR_SIZE_BYTES)
                .take(64)
                .all(|block| isal.crc32c(0, block) == crate::crc32c(0, block));
            report.row(
                "crc32c 4K blocks",
                "isa-l crc32_iscsi 1 thread",
                Some(m),
                if agrees { "same values" } else { "VALUES DIFFER" },
            );
        }
        if let Some(system) = &gpu {
            crate::cuda::bench_crc32c(system, &config, &mut report);
        }
    }

    if config.services.iter().any(|s| s == "xts") {
        let key = XtsKey::new(&random_bytes(64, 2).try_into().unwrap());
        let mut data = random_bytes(config.cpu_bytes, 3);
        for (threads, label) in &engines {
            let engine = CpuEngine::new(*threads);
            for direction in [Direction::Encrypt, Direction::Decrypt] {
                let m = measure(data.len(), config.minimum_seconds, || {
                    engine.xts(&key, direction, Sectors::Consecutive(1000), &mut data).unwrap()
                });
                report.row(&format!("aes-256-xts {direction:?}").to_lowercase(), label, Some(m), "4 KiB sectors");
            }
        }
        if config.openssl {
            for threads in [1usize, config.threads] {
                let label = format!("openssl speed {threads} thread{}", if threads == 1 { "" } else { "s" });
                match openssl_xts(threads, 1) {
                    Ok(measurement) => report.row(
                        "aes-256-xts encrypt",
                        &label,
                        Some(measurement),
                        "openssl speed -evp aes-256-xts -bytes 4096 (CPU time: the children's, start-up included)",
                    ),
                    Err(reason) => report.row("aes-256-xts encrypt", &label, None, reason),
                }
                if config.threads == 1 {
                    break;
                }
            }
        }
        if let Some(system) = &gpu {
            crate::cuda::bench_xts(system, &config, &key, &mut report);
        }
    }

    if config.services.iter().any(|s| s == "rs") {
        for &(k, m) in &config.reed_solomon_shapes {
            let code = match ReedSolomon::new(k, m) {
                Ok(code) => code,
                Err(error) => return Err(error.to_string()),
            };
            let shard_bytes = (config.cpu_bytes / k) & !63;
            let data: Vec<Vec<u8>> = (0..k).map(|i| random_bytes(shard_bytes, 10 + i as u64)).collect();
            let inputs: Vec<&[u8]> = data.iter().map(|s| s.as_slice()).collect();
            let mut parity = vec![vec![0u8; shard_bytes]; m];
            let stripe_bytes = shard_bytes * k;
            for (threads, label) in &engines {
                let engine = CpuEngine::new(*threads);
                let measurement = measure(stripe_bytes, config.minimum_seconds, || {
                    let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|s| s.as_mut_slice()).collect();
                    engine.reed_solomon_encode(&code, &inputs, &mut outputs).unwrap()
                });
                report.row(&format!("rs {k}+{m} encode"), label, Some(measurement), "GB of data shards");
                // Decode: lose the first min(m, k) data shards and rebuild them.
                let lost = m.min(k);
                let mut shards: Vec<Vec<u8>> = data.iter().chain(parity.iter()).cloned().collect();
                let present: Vec<bool> = (0..k + m).map(|index| index >= lost).collect();
                let measurement = measure(stripe_bytes, config.minimum_seconds, || {
                    let mut views: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
                    engine.reed_solomon_reconstruct(&code, &mut views, &present).unwrap()
                });
                assert!(shards[..lost].iter().zip(&data).all(|(a, b)| a == b), "reconstruction differs");
                report.row(&format!("rs {k}+{m} decode ({lost} lost)"), label, Some(measurement), "GB of data shards");
            }
            if let Ok(isal) = &isal {
                let (agrees, measurement) = isal.encode_benchmark(k, m, &inputs, &parity, config.minimum_seconds);
                report.row(
                    &format!("rs {k}+{m} encode"),
                    "isa-l ec_encode_data 1 thread",
                    Some(measurement),
                    if agrees { "same parity (Cauchy)" } else { "PARITY DIFFERS" },
                );
            }
            if let Ok(isal) = &isal {
                // ISA-L decode: its ec_encode_data with our decode matrix for the same loss.
                let lost = m.min(k);
                let present: Vec<bool> = (0..k + m).map(|index| index >= lost).collect();
                if let Ok(plan) = code.reconstruction_plan(&present) {
                    let sources: Vec<&[u8]> = plan
                        .sources
                        .iter()
                        .map(|&index| if index < k { data[index].as_slice() } else { parity[index - k].as_slice() })
                        .collect();
                    let expected: Vec<&[u8]> = plan.missing.iter().map(|&index| data[index].as_slice()).collect();
                    let (agrees, measurement) = isal.apply_benchmark(
                        &plan.matrix,
                        plan.missing.len(),
                        &sources,
                        &expected,
                        config.minimum_seconds,
                    );
                    report.row(
                        &format!("rs {k}+{m} decode ({lost} lost)"),
                        "isa-l ec_encode_data 1 thread",
                        Some(measurement),
                        if agrees { "same shards rebuilt" } else { "REBUILT SHARDS DIFFER" },
                    );
                }
            }
            if let Some(system) = &gpu {
                crate::cuda::bench_reed_solomon(system, &config, &code, &mut report);
            }
        }
    }
    if config.services.iter().any(|s| s == "xts") {
        bench_runtime_small_requests(&config, gpu.is_some(), &mut report);
    }
    report.note(format!("bench took {:.1} s", started.elapsed().as_secs_f64()));
    Ok(report.render())
}

/// Bytes each side of a per-core comparison works on: cache-resident for both (OpenSSL's
/// `speed` reuses one 4 KiB buffer), so the rows compare code, not memory bandwidth.
const PER_CORE_BYTES: usize = 1 << 20;
/// Alternations of ours and the peer; the report gives medians. Alternating, rather than one
/// long run each, keeps clock-speed drift (turbo, other tenants) from favouring either side.
const PER_CORE_ROUNDS: usize = 5;

fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Ours on one thread against ISA-L and OpenSSL on one thread, alternating rounds on the same
/// cache-resident data; one row per side with the median throughput, and a note with the median
/// of the per-round ratios and their range.
fn per_core_comparisons(config: &BenchConfig, isal: Option<&crate::isal::Isal>, report: &mut Report) {
    fn compare(
        report: &mut Report,
        service: &str,
        peer: &str,
        target: &str,
        ours: &mut dyn FnMut() -> Option<Measurement>,
        theirs: &mut dyn FnMut() -> Option<Measurement>,
    ) {
        let (mut ours_rates, mut theirs_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..PER_CORE_ROUNDS {
            let (Some(mine), Some(peer_rate)) = (ours(), theirs()) else {
                report.note(format!("{service} per core: {peer} could not be measured"));
                return;
            };
            ratios.push(mine.gigabytes_per_second / peer_rate.gigabytes_per_second);
            ours_rates.push(mine);
            theirs_rates.push(peer_rate);
        }
        let pick = |measurements: &mut Vec<Measurement>| {
            measurements.sort_by(|a, b| a.gigabytes_per_second.total_cmp(&b.gigabytes_per_second));
            measurements[measurements.len() / 2].clone()
        };
        let label = format!("median of {PER_CORE_ROUNDS} alternating rounds, 1 MiB in cache");
        report.row(service, "per core: cpu 1 thread", Some(pick(&mut ours_rates)), label.clone());
        report.row(service, &format!("per core: {peer}"), Some(pick(&mut theirs_rates)), label);
        let (low, high) = (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        report.note(format!(
            "{service} per core: cpu engine / {peer} = {:.2} (median of {PER_CORE_ROUNDS} rounds, range {low:.2}-{high:.2}; target {target})",
            median(&mut ratios)
        ));
    }
    let engine = CpuEngine::new(1);
    let round_seconds = (config.minimum_seconds / 2.0).max(0.2);

    if config.services.iter().any(|s| s == "crc32c") {
        if let Some(isal) = isal {
            let data = random_bytes(PER_CORE_BYTES, 21);
            let mut checksums = vec![0u32; PER_CORE_BYTES / SECTOR_SIZE_BYTES];
            compare(
                report,
                "crc32c 4K blocks",
                "isa-l crc32_iscsi",
                "≥ 0.80",
                &mut || {
                    Some(measure(data.len(), round_seconds, || {
                        engine.crc32c_blocks(&data, SECTOR_SIZE_BYTES, &mut checksums).unwrap()
                    }))
                },
                &mut || {
                    Some(measure(data.len(), round_seconds, || {
                        for block in data.chunks_exact(SECTOR_SIZE_BYTES) {
                            std::hint::black_box(isal.crc32c(0, block));
                        }
                    }))
                },
            );
        }
    }
    if config.services.iter().any(|s| s == "xts") && config.openssl {
        let key = XtsKey::new(&random_bytes(64, 22).try_into().unwrap());
        let mut data = random_bytes(PER_CORE_BYTES, 23);
        // `openssl speed` counts whole seconds; ours runs as long, so both rounds weigh the same.
        compare(
            report,
            "aes-256-xts encrypt",
            "openssl speed",
            "≥ 0.80",
            &mut || {
                Some(measure(data.len(), 1.0, || {
                    engine.xts(&key, Direction::Encrypt, Sectors::Consecutive(1000), &mut data).unwrap()
                }))
            },
            &mut || openssl_xts(1, 1).ok(),
        );
    }
    if config.services.iter().any(|s| s == "rs") {
        if let Some(isal) = isal {
            for &(k, m) in &config.reed_solomon_shapes {
                let Ok(code) = ReedSolomon::new(k, m) else { continue };
                let shard_bytes = (PER_CORE_BYTES / k) & !63;
                let data: Vec<Vec<u8>> = (0..k).map(|i| random_bytes(shard_bytes, 30 + i as u64)).collect();
                let inputs: Vec<&[u8]> = data.iter().map(|shard| shard.as_slice()).collect();
                let mut ours_parity = vec![vec![0u8; shard_bytes]; m];
                let mut theirs_parity = vec![vec![0u8; shard_bytes]; m];
                let tables = isal.cauchy_tables(k, m);
                compare(
                    report,
                    &format!("rs {k}+{m} encode"),
                    "isa-l ec_encode_data",
                    "≥ 0.80",
                    &mut || {
                        Some(measure(shard_bytes * k, round_seconds, || {
                            let mut outputs: Vec<&mut [u8]> =
                                ours_parity.iter_mut().map(|shard| shard.as_mut_slice()).collect();
                            engine.reed_solomon_encode(&code, &inputs, &mut outputs).unwrap()
                        }))
                    },
                    &mut || {
                        Some(measure(shard_bytes * k, round_seconds, || {
                            isal.encode_with_tables(&tables, &inputs, &mut theirs_parity)
                        }))
                    },
                );
                if ours_parity != theirs_parity {
                    report.note(format!("rs {k}+{m}: ISA-L's parity DIFFERS from ours"));
                }
            }
        }
    }
}

/// 4 KiB XTS requests through the runtime's queue: merged into batches, run on the engine the
/// hybrid threshold picks.
fn bench_runtime_small_requests(config: &BenchConfig, gpu_allowed: bool, report: &mut Report) {
    use crate::runtime::{Accelerator, Mode, Request, RuntimeConfig};
    use std::sync::Arc;
    let mode = if gpu_allowed { Mode::Hybrid } else { Mode::Cpu };
    let accelerator = Accelerator::new(RuntimeConfig { mode, ..RuntimeConfig::default() });
    for line in accelerator.describe().lines() {
        report.note(format!("runtime: {line}"));
    }
    let key = Arc::new(XtsKey::new(&random_bytes(64, 5).try_into().unwrap()));
    let count = 4096;
    let measurement = measure(count * SECTOR_SIZE_BYTES, config.minimum_seconds, || {
        let completions: Vec<_> = (0..count)
            .map(|index| {
                accelerator.submit(Request::Xts {
                    key: Arc::clone(&key),
                    direction: Direction::Encrypt,
                    first_sector: index as u64,
                    data: accelerator.buffer(SECTOR_SIZE_BYTES),
                })
            })
            .collect();
        for completion in completions {
            completion.wait().expect("queued XTS request failed");
        }
    });
    let (batches, requests) = accelerator.statistics();
    report.row(
        "aes-256-xts encrypt",
        "runtime queue, 4 KiB requests",
        Some(measurement),
        format!("{requests} requests merged into {batches} batches"),
    );
}
