//! Loaders for the Alibaba `cluster-trace-gpu-v2023` ("openb") CSV files.
//!
//! Node lists: `sn,cpu_milli,memory_mib,gpu,model`. Pod lists:
//! `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`,
//! or only the first five columns (the `multigpu*` variants). Columns are found
//! by header name, so their order does not matter; a malformed row is rejected
//! with the file, the line and the column.

use std::fmt;
use std::io::Read;
use std::path::Path;

/// One GPU node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub name: String,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub gpus: u32,
    /// GPU model; empty for a CPU-only node.
    pub model: String,
}

/// One task (pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRow {
    pub name: String,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub num_gpu: u32,
    /// Milli-GPU per GPU: 1..999 for a shared GPU, 1000 for whole GPUs, 0 without.
    pub gpu_milli: u32,
    /// Allowed GPU models; empty = any.
    pub gpu_spec: Vec<String>,
    pub qos: String,
    pub phase: String,
    pub creation_time: Option<u64>,
    pub deletion_time: Option<u64>,
    pub scheduled_time: Option<u64>,
}

/// Why a trace file was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub file: String,
    /// 1-based line; 0 when the problem is the file as a whole.
    pub line: u64,
    /// Column name, when one is at fault.
    pub column: Option<String>,
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if let Some(c) = &self.column {
            write!(f, ": column `{c}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for TraceError {}

fn err(file: &str, line: u64, column: Option<&str>, message: impl Into<String>) -> TraceError {
    TraceError {
        file: file.to_string(),
        line,
        column: column.map(str::to_string),
        message: message.into(),
    }
}

/// Reads a node list from a file.
pub fn load_nodes(path: &Path) -> Result<Vec<NodeRow>, TraceError> {
    let label = path.display().to_string();
    let f =
        std::fs::File::open(path).map_err(|e| err(&label, 0, None, format!("cannot open: {e}")))?;
    parse_nodes(&label, f)
}

/// Reads a pod list from a file.
pub fn load_pods(path: &Path) -> Result<Vec<PodRow>, TraceError> {
    let label = path.display().to_string();
    let f =
        std::fs::File::open(path).map_err(|e| err(&label, 0, None, format!("cannot open: {e}")))?;
    parse_pods(&label, f)
}

struct Table<R: Read> {
    file: String,
    reader: csv::Reader<R>,
    header: Vec<String>,
}

impl<R: Read> Table<R> {
    fn open(file: &str, input: R, required: &[&str]) -> Result<Self, TraceError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(false)
            .from_reader(input);
        let header: Vec<String> = reader
            .headers()
            .map_err(|e| err(file, 1, None, format!("cannot read the header: {e}")))?
            .iter()
            .map(|h| h.trim().to_string())
            .collect();
        for r in required {
            if !header.iter().any(|h| h == r) {
                return Err(err(
                    file,
                    1,
                    Some(r),
                    format!(
                        "missing in the header (found: {}); is this the right kind of file?",
                        header.join(",")
                    ),
                ));
            }
        }
        Ok(Table {
            file: file.to_string(),
            reader,
            header,
        })
    }

    fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// Calls `row` with each record and its line number.
    fn rows(
        mut self,
        mut row: impl FnMut(&Fields<'_>) -> Result<(), TraceError>,
    ) -> Result<(), TraceError> {
        let mut rec = csv::StringRecord::new();
        loop {
            match self.reader.read_record(&mut rec) {
                Ok(false) => return Ok(()),
                Ok(true) => {
                    let line = rec.position().map_or(0, |p| p.line());
                    row(&Fields {
                        table_file: &self.file,
                        header: &self.header,
                        rec: &rec,
                        line,
                    })?;
                }
                Err(e) => {
                    let line = e.position().map_or(0, |p| p.line());
                    let msg = match e.kind() {
                        csv::ErrorKind::UnequalLengths {
                            expected_len, len, ..
                        } => format!("{len} fields where the header has {expected_len}"),
                        _ => e.to_string(),
                    };
                    return Err(err(&self.file, line, None, msg));
                }
            }
        }
    }
}

struct Fields<'a> {
    table_file: &'a str,
    header: &'a [String],
    rec: &'a csv::StringRecord,
    line: u64,
}

impl Fields<'_> {
    fn raw(&self, col: usize) -> &str {
        self.rec.get(col).unwrap_or("").trim()
    }

    fn fail(&self, col: usize, msg: impl Into<String>) -> TraceError {
        err(
            self.table_file,
            self.line,
            self.header.get(col).map(String::as_str),
            msg,
        )
    }

    fn int(&self, col: usize, min: i64, max: i64) -> Result<i64, TraceError> {
        let v = self.raw(col);
        let n: i64 = v
            .parse()
            .map_err(|_| self.fail(col, format!("`{v}` is not an integer")))?;
        if n < min || n > max {
            return Err(self.fail(col, format!("{n} is outside {min}..={max}")));
        }
        Ok(n)
    }

    fn opt_time(&self, col: Option<usize>) -> Result<Option<u64>, TraceError> {
        let Some(c) = col else { return Ok(None) };
        if self.raw(c).is_empty() {
            return Ok(None);
        }
        Ok(Some(self.int(c, 0, i64::MAX)? as u64))
    }

    fn name(&self, col: usize) -> Result<String, TraceError> {
        let v = self.raw(col);
        if v.is_empty() {
            return Err(self.fail(col, "empty name"));
        }
        Ok(v.to_string())
    }
}

const MAX_CPU: i64 = 1 << 40;
const MAX_MEM: i64 = 1 << 40;

/// Parses a node list; `file` names the source in errors.
pub fn parse_nodes(file: &str, input: impl Read) -> Result<Vec<NodeRow>, TraceError> {
    let t = Table::open(
        file,
        input,
        &["sn", "cpu_milli", "memory_mib", "gpu", "model"],
    )?;
    let c = |n| t.col(n).expect("checked in open");
    let (sn, cpu, mem, gpu, model) = (
        c("sn"),
        c("cpu_milli"),
        c("memory_mib"),
        c("gpu"),
        c("model"),
    );
    let mut out = Vec::new();
    t.rows(|f| {
        let gpus = f.int(gpu, 0, 1024)? as u32;
        let m = f.raw(model).to_string();
        if gpus > 0 && m.is_empty() {
            return Err(f.fail(model, format!("empty, but the node has {gpus} GPUs")));
        }
        out.push(NodeRow {
            name: f.name(sn)?,
            cpu_milli: f.int(cpu, 0, MAX_CPU)?,
            memory_mib: f.int(mem, 0, MAX_MEM)?,
            gpus,
            model: m,
        });
        Ok(())
    })?;
    Ok(out)
}

/// Parses a pod list; `file` names the source in errors.
pub fn parse_pods(file: &str, input: impl Read) -> Result<Vec<PodRow>, TraceError> {
    let t = Table::open(
        file,
        input,
        &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"],
    )?;
    let c = |n| t.col(n).expect("checked in open");
    let (name, cpu, mem, num, milli) = (
        c("name"),
        c("cpu_milli"),
        c("memory_mib"),
        c("num_gpu"),
        c("gpu_milli"),
    );
    let (spec, qos, phase) = (t.col("gpu_spec"), t.col("qos"), t.col("pod_phase"));
    let (ct, dt, st) = (
        t.col("creation_time"),
        t.col("deletion_time"),
        t.col("scheduled_time"),
    );
    let mut out = Vec::new();
    t.rows(|f| {
        let num_gpu = f.int(num, 0, 1024)? as u32;
        let gpu_milli = f.int(milli, 0, 1000)? as u32;
        if num_gpu == 0 && gpu_milli != 0 {
            return Err(f.fail(milli, format!("{gpu_milli} milli-GPU but num_gpu is 0")));
        }
        if num_gpu > 0 && gpu_milli == 0 {
            return Err(f.fail(milli, format!("0 milli-GPU but num_gpu is {num_gpu}")));
        }
        if num_gpu > 1 && gpu_milli < 1000 {
            return Err(f.fail(
                milli,
                format!(
                    "{gpu_milli} milli-GPU on each of {num_gpu} GPUs: only one GPU can be shared"
                ),
            ));
        }
        let gpu_spec = spec
            .map(|c| {
                f.raw(c)
                    .split('|')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let creation_time = f.opt_time(ct)?;
        let deletion_time = f.opt_time(dt)?;
        if let (Some(c), Some(d), Some(col)) = (creation_time, deletion_time, dt) {
            if d < c {
                return Err(f.fail(col, format!("deletion {d} is before creation {c}")));
            }
        }
        out.push(PodRow {
            name: f.name(name)?,
            cpu_milli: f.int(cpu, 0, MAX_CPU)?,
            memory_mib: f.int(mem, 0, MAX_MEM)?,
            num_gpu,
            gpu_milli,
            gpu_spec,
            qos: qos.map(|c| f.raw(c).to_string()).unwrap_or_default(),
            phase: phase.map(|c| f.raw(c).to_string()).unwrap_or_default(),
            creation_time,
            deletion_time,
            scheduled_time: f.opt_time(st)?,
        });
        Ok(())
    })?;
    Ok(out)
}
