//! Reading PyTorch `torch.save` state dicts (`pytorch_model.bin`) without
//! torch or Python: the zip container of torch >= 1.6 and a minimal, safe
//! pickle machine for what torch writes into its `data.pkl`.
//!
//! Layout: `<folder>/data.pkl` (the pickled dict), `<folder>/data/<key>` (one
//! raw little-endian storage per key), optional `<folder>/byteorder`
//! (`little`; `big` is refused). The folder name varies (torch uses the file
//! stem or `archive`), so `data.pkl` is looked up under any one top-level
//! folder.
//!
//! The pickle machine executes nothing: a `GLOBAL` is resolved against a
//! whitelist (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
//! `torch._utils._rebuild_parameter[_with_state]`, the typed storage classes,
//! `torch.serialization._get_layout`, `torch.strided`) and anything else is an
//! error naming it. Tensors are views `(storage, offset, size, stride)`; they
//! are materialised contiguous and row-major at the end, one storage read
//! from the archive at a time.
//!
//! Top-level values that are tensors (or `nn.Parameter`s) are returned.
//! Values that hold no tensor at all (ints, strings, `None`, dicts or lists of
//! such: config or bookkeeping entries) are skipped silently; a value that
//! holds tensors without being one (a nested state dict, a list of tensors,
//! a bare storage) is an error naming the key, so weights are never dropped
//! quietly. Legacy files (torch < 1.6, not a zip) are an error asking to
//! re-save or convert to safetensors.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::Path;

use half::{bf16, f16};
use zip::ZipArchive;

/// `return Err(format!(...))`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(format!($($arg)*))
    };
}

/// Element type of a tensor, from its storage class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchDtype {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl TorchDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            TorchDtype::F64 | TorchDtype::I64 => 8,
            TorchDtype::F32 | TorchDtype::I32 => 4,
            TorchDtype::F16 | TorchDtype::BF16 | TorchDtype::I16 => 2,
            TorchDtype::I8 | TorchDtype::U8 | TorchDtype::Bool => 1,
        }
    }

    fn from_storage_class(name: &str) -> Option<Self> {
        Some(match name {
            "FloatStorage" => TorchDtype::F32,
            "DoubleStorage" => TorchDtype::F64,
            "HalfStorage" => TorchDtype::F16,
            "BFloat16Storage" => TorchDtype::BF16,
            "LongStorage" => TorchDtype::I64,
            "IntStorage" => TorchDtype::I32,
            "ShortStorage" => TorchDtype::I16,
            "CharStorage" => TorchDtype::I8,
            "ByteStorage" => TorchDtype::U8,
            "BoolStorage" => TorchDtype::Bool,
            _ => return None,
        })
    }
}

/// A tensor read from a checkpoint: contiguous, row-major, little-endian.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchTensor {
    pub shape: Vec<usize>,
    pub dtype: TorchDtype,
    pub data: Vec<u8>,
}

fn arr<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

impl TorchTensor {
    /// The data split into elements, after checking its length.
    fn elements(&self) -> Result<std::slice::ChunksExact<'_, u8>, String> {
        let numel = checked_numel(&self.shape)?;
        let size = self.dtype.size();
        if numel.checked_mul(size) != Some(self.data.len()) {
            let (shape, dtype, n) = (&self.shape, self.dtype, self.data.len());
            bail!("{dtype:?} tensor of shape {shape:?} has {n} bytes");
        }
        Ok(self.data.chunks_exact(size))
    }

    /// The values as f32, from any float or integer dtype (integers beyond
    /// 2^24 round; bool is 0 or 1).
    pub fn to_f32(&self) -> Result<Vec<f32>, String> {
        let e = self.elements()?;
        Ok(match self.dtype {
            TorchDtype::F32 => e.map(|c| f32::from_le_bytes(arr(c))).collect(),
            TorchDtype::F64 => e.map(|c| f64::from_le_bytes(arr(c)) as f32).collect(),
            TorchDtype::F16 => e.map(|c| f16::from_le_bytes(arr(c)).to_f32()).collect(),
            TorchDtype::BF16 => e.map(|c| bf16::from_le_bytes(arr(c)).to_f32()).collect(),
            _ => self.to_i64()?.into_iter().map(|v| v as f32).collect(),
        })
    }

    /// The values as i64, from an integer or bool dtype; floats are an error.
    pub fn to_i64(&self) -> Result<Vec<i64>, String> {
        let e = self.elements()?;
        Ok(match self.dtype {
            TorchDtype::I64 => e.map(|c| i64::from_le_bytes(arr(c))).collect(),
            TorchDtype::I32 => e.map(|c| i32::from_le_bytes(arr(c)) as i64).collect(),
            TorchDtype::I16 => e.map(|c| i16::from_le_bytes(arr(c)) as i64).collect(),
            TorchDtype::I8 => e.map(|c| c[0] as i8 as i64).collect(),
            TorchDtype::U8 => e.map(|c| c[0] as i64).collect(),
            TorchDtype::Bool => e.map(|c| (c[0] != 0) as i64).collect(),
            float => bail!("tensor is {float:?}, not an integer or bool tensor"),
        })
    }
}

/// Bytes of the length (or value) prefix of a sized opcode.
fn prefix(op: u8) -> usize {
    match op {
        b'C' | 0x8a | 0x8c => 1,
        b'B' | b'X' | 0x8b => 4,
        _ => 8,
    }
}

fn checked_numel(shape: &[usize]) -> Result<usize, String> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("tensor shape {shape:?} overflows"))
}

/// Reads every tensor of a `torch.save`d state dict, by name.
pub fn read_state_dict(path: &Path) -> Result<BTreeMap<String, TorchTensor>, String> {
    read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn read(path: &Path) -> Result<BTreeMap<String, TorchTensor>, String> {
    let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(0); // a reservation cap only
    let mut head = Vec::new();
    let reader = &mut (&file).take(2);
    reader
        .read_to_end(&mut head)
        .map_err(|e| format!("cannot read: {e}"))?;
    if !head.starts_with(b"PK") {
        return Err(if head.starts_with(&[0x80]) {
            "legacy (torch < 1.6, non-zip) checkpoint: re-save it with a newer torch \
             (`torch.save(torch.load(f), f)`) or convert it to safetensors"
        } else {
            "not a PyTorch zip checkpoint (no zip signature)"
        }
        .to_string());
    }
    let mut zip = ZipArchive::new(file).map_err(|e| format!("bad zip archive: {e}"))?;
    let prefix = find_prefix(&zip)?;
    let byteorder = format!("{prefix}/byteorder");
    if zip.index_for_name(&byteorder).is_some() {
        match read_entry(&mut zip, &byteorder, file_len)?.trim_ascii() {
            b"little" => {}
            b"big" => return Err("big-endian checkpoint (byteorder `big`) is not supported".into()),
            other => bail!("unknown byteorder `{}`", String::from_utf8_lossy(other)),
        }
    }
    let pickle = read_entry(&mut zip, &format!("{prefix}/data.pkl"), file_len)?;
    let mut vm = Vm::default();
    let top = vm.run(&pickle)?;
    let Obj::Dict(items) = &vm.objs[top] else {
        let kind = vm.objs[top].kind();
        bail!("top-level object is {kind}, not a dict of tensors");
    };
    let mut views: BTreeMap<&str, &View> = BTreeMap::new(); // a repeated name: the last wins
    for &(k, v) in items {
        match (&vm.objs[k], &vm.objs[v]) {
            (Obj::Str(name), Obj::Tensor(view)) => {
                views.insert(name, view);
            }
            _ if !vm.holds_tensor(v) => {}
            (Obj::Str(name), value) => {
                let kind = value.kind();
                bail!("`{name}` is {kind} holding tensors, not a tensor");
            }
            (key, _) => bail!("a tensor is keyed by {}", key.kind()),
        }
    }
    // Grouped by storage, so one storage at a time is in memory.
    let mut by_storage: BTreeMap<&str, Vec<(&str, &View)>> = BTreeMap::new();
    for (name, view) in views {
        by_storage.entry(&view.key).or_default().push((name, view));
    }
    let mut out = BTreeMap::new();
    for (key, users) in by_storage {
        let mut bytes = read_entry(&mut zip, &format!("{prefix}/data/{key}"), file_len)?;
        let single = users.len() == 1;
        for (name, view) in users {
            if view.storage_numel.checked_mul(view.dtype.size()) != Some(bytes.len()) {
                let (n, dtype, len) = (view.storage_numel, view.dtype, bytes.len());
                bail!("storage `{key}` has {len} bytes, not {n} {dtype:?} elements");
            }
            // A tensor that is a whole storage on its own takes it uncopied.
            let whole = view.offset == 0 && checked_numel(&view.shape) == Ok(view.storage_numel);
            let whole = whole && view.is_contiguous();
            let data = if single && whole {
                std::mem::take(&mut bytes)
            } else {
                view.gather(name, &bytes)?
            };
            let (shape, dtype) = (view.shape.clone(), view.dtype);
            out.insert(name.to_string(), TorchTensor { shape, dtype, data });
        }
    }
    Ok(out)
}

/// The one top-level folder holding `data.pkl`.
fn find_prefix(zip: &ZipArchive<File>) -> Result<String, String> {
    let mut found: Vec<&str> = zip
        .file_names()
        .filter_map(|n| n.strip_suffix("/data.pkl"))
        .filter(|p| !p.is_empty() && !p.contains('/'))
        .collect();
    found.sort_unstable();
    found.dedup();
    match found.as_slice() {
        [one] => Ok(one.to_string()),
        [] => Err("no `<folder>/data.pkl` in the zip archive: not a torch.save checkpoint".into()),
        many => Err(format!("several `data.pkl` (folders {many:?})")),
    }
}

/// A whole zip entry; the reservation is capped by the file's length so a
/// corrupt size field cannot ask for absurd memory up front.
fn read_entry(zip: &mut ZipArchive<File>, name: &str, file_len: u64) -> Result<Vec<u8>, String> {
    let err = |e: &dyn std::fmt::Display| format!("zip entry `{name}`: {e}");
    let mut entry = zip.by_name(name).map_err(|e| err(&e))?;
    let mut buf = Vec::new();
    let hint = usize::try_from(entry.size().min(file_len)).unwrap_or(0);
    buf.try_reserve_exact(hint).map_err(|e| err(&e))?;
    entry.read_to_end(&mut buf).map_err(|e| err(&e))?;
    Ok(buf)
}

/// A whitelisted global.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Global {
    OrderedDict,
    RebuildTensor,
    RebuildParameter,
    Storage(TorchDtype),
    GetLayout,
    Strided,
}

fn resolve_global(module: &str, name: &str) -> Result<Global, String> {
    if let Some(dtype) = TorchDtype::from_storage_class(name).filter(|_| module == "torch") {
        return Ok(Global::Storage(dtype));
    }
    Ok(match (module, name) {
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensor,
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
            Global::RebuildParameter
        }
        ("torch.serialization", "_get_layout") => Global::GetLayout,
        ("torch", "strided") => Global::Strided,
        _ => bail!("refusing pickle global `{module}.{name}` (not a tensor constructor)"),
    })
}

/// A tensor before materialisation: a strided view of one storage, checked
/// to lie inside it.
#[derive(Debug, Clone, PartialEq)]
struct View {
    key: String,
    dtype: TorchDtype,
    storage_numel: usize,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

impl View {
    fn is_contiguous(&self) -> bool {
        let mut expect = 1;
        for (&size, &stride) in self.shape.iter().zip(&self.stride).rev() {
            if size != 1 && stride != expect {
                return false;
            }
            expect *= size;
        }
        true
    }

    /// Copies the view out of its storage's `bytes` in row-major order.
    fn gather(&self, name: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
        let (es, numel) = (self.dtype.size(), checked_numel(&self.shape)?);
        let slice = |first: usize, count: usize| bytes.get(first * es..(first + count) * es);
        let outside = || format!("tensor `{name}` lies outside its storage");
        if numel == 0 {
            return Ok(Vec::new());
        } else if self.is_contiguous() {
            return Ok(slice(self.offset, numel).ok_or_else(outside)?.to_vec());
        }
        let mut out = Vec::new();
        let total = numel.saturating_mul(es);
        let alloc = out.try_reserve_exact(total);
        alloc.map_err(|e| format!("tensor `{name}`: cannot allocate {total} bytes: {e}"))?;
        for i in 0..numel {
            let (mut rest, mut src) = (i, self.offset);
            for (&size, &stride) in self.shape.iter().zip(&self.stride).rev() {
                src += rest % size * stride;
                rest /= size;
            }
            out.extend_from_slice(slice(src, 1).ok_or_else(outside)?);
        }
        Ok(out)
    }
}

/// A pickled object. Containers refer to others by index in `Vm::objs`, so
/// a memoised dict or list that is filled later is shared as in Python.
#[derive(Debug, Clone, PartialEq)]
enum Obj {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes,
    Tuple(Vec<usize>),
    List(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    Global(Global),
    /// dtype, key in `data/`, number of elements
    Storage(TorchDtype, String, usize),
    Tensor(View),
}

impl Obj {
    fn kind(&self) -> &'static str {
        match self {
            Obj::None => "None",
            Obj::Bool(_) => "a bool",
            Obj::Int(_) => "an int",
            Obj::Float(_) => "a float",
            Obj::Str(_) => "a string",
            Obj::Bytes => "bytes",
            Obj::Tuple(_) => "a tuple",
            Obj::List(_) => "a list",
            Obj::Dict(_) => "a dict",
            Obj::Global(_) => "a global",
            Obj::Storage(..) => "a storage",
            Obj::Tensor(_) => "a tensor",
        }
    }
}

/// The pickle machine: an object arena, the stack and marks of indices into
/// it, and the memo.
#[derive(Default)]
struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    objs: Vec<Obj>,
    stack: Vec<usize>,
    marks: Vec<usize>,
    memo: HashMap<u64, usize>,
}

impl<'a> Vm<'a> {
    /// Runs `data` to STOP and returns the result's index.
    fn run(&mut self, data: &'a [u8]) -> Result<usize, String> {
        self.data = data;
        loop {
            let at = self.pos;
            let Some(&op) = self.data.get(at) else {
                return Err("data.pkl ends before STOP (truncated)".into());
            };
            self.pos += 1;
            if op == b'.' {
                return self.pop().map_err(|e| format!("data.pkl at STOP: {e}"));
            }
            self.step(op)
                .map_err(|e| format!("data.pkl byte {at} (opcode {op:#04x}): {e}"))?;
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| format!("needs {n} more bytes: data.pkl is truncated"))?;
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// A little-endian unsigned integer of `n` <= 8 bytes.
    fn uint(&mut self, n: usize) -> Result<u64, String> {
        let bytes = self.take(n)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn len(&mut self, n: usize) -> Result<usize, String> {
        usize::try_from(self.uint(n)?).map_err(|_| "length too large".to_string())
    }

    fn line(&mut self) -> Result<String, String> {
        let rest = &self.data[self.pos..];
        let end = rest.iter().position(|&b| b == b'\n');
        let end = end.ok_or("unterminated GLOBAL line")?;
        let text = std::str::from_utf8(&rest[..end]).map_err(|_| "GLOBAL name is not UTF-8")?;
        self.pos += end + 1;
        Ok(text.to_string())
    }

    fn push(&mut self, obj: Obj) {
        self.objs.push(obj);
        self.stack.push(self.objs.len() - 1);
    }

    fn pop(&mut self) -> Result<usize, String> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err("pop past a MARK".into());
        }
        self.stack.pop().ok_or_else(|| "stack underflow".into())
    }

    fn pop_n(&mut self, n: usize) -> Result<Vec<usize>, String> {
        let mut items = (0..n).map(|_| self.pop()).collect::<Result<Vec<_>, _>>()?;
        items.reverse();
        Ok(items)
    }

    fn pop_mark(&mut self) -> Result<Vec<usize>, String> {
        let mark = self.marks.pop().ok_or("no MARK on the stack")?;
        if mark > self.stack.len() {
            return Err("MARK above the stack".into());
        }
        Ok(self.stack.split_off(mark))
    }

    fn top(&self) -> Result<usize, String> {
        let top = self.stack.last().copied();
        top.ok_or_else(|| "empty stack".into())
    }

    fn str_of(&self, id: usize) -> Result<&str, String> {
        match &self.objs[id] {
            Obj::Str(s) => Ok(s),
            other => Err(format!("expected a string, found {}", other.kind())),
        }
    }

    fn usize_of(&self, id: usize, what: &str) -> Result<usize, String> {
        match self.objs[id] {
            Obj::Int(v) => usize::try_from(v).map_err(|_| format!("{what} is {v}")),
            ref other => Err(format!("{what} is {}, not an int", other.kind())),
        }
    }

    fn usizes_of(&self, id: usize, what: &str) -> Result<Vec<usize>, String> {
        match &self.objs[id] {
            Obj::Tuple(items) => items.iter().map(|&i| self.usize_of(i, what)).collect(),
            other => Err(format!("{what} is {}, not a tuple", other.kind())),
        }
    }

    /// SETITEM(S) or APPEND(S) into the container on top of the stack.
    fn extend_top(&mut self, items: Vec<usize>) -> Result<(), String> {
        let top = self.top()?;
        match &mut self.objs[top] {
            Obj::Dict(pairs) if items.chunks_exact(2).remainder().is_empty() => {
                pairs.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])))
            }
            Obj::List(list) => list.extend(items),
            other => bail!("cannot add {} items to {}", items.len(), other.kind()),
        }
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<(), String> {
        let id = self.memo.get(&index).copied();
        self.stack
            .push(id.ok_or_else(|| format!("memo entry {index} is missing"))?);
        Ok(())
    }

    /// One opcode other than STOP.
    fn step(&mut self, op: u8) -> Result<(), String> {
        let obj = match op {
            0x80 => match self.uint(1)? {
                2..=5 => return Ok(()),
                p => bail!("unsupported pickle protocol {p}"),
            },
            0x95 => return self.take(8).map(|_| ()), // FRAME
            b'c' => {
                let (module, name) = (self.line()?, self.line()?);
                Obj::Global(resolve_global(&module, &name)?)
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                Obj::Global(resolve_global(self.str_of(module)?, self.str_of(name)?)?)
            }
            b'(' => {
                self.marks.push(self.stack.len());
                return Ok(());
            }
            b'0' => return self.pop().map(|_| ()),
            b'1' => return self.pop_mark().map(|_| ()),
            b'2' => {
                let top = self.top()?;
                self.stack.push(top);
                return Ok(());
            }
            b'}' => Obj::Dict(Vec::new()),
            b']' => Obj::List(Vec::new()),
            b')' => Obj::Tuple(Vec::new()),
            b'd' | b'l' => {
                let items = self.pop_mark()?;
                self.push(if op == b'd' {
                    Obj::Dict(Vec::new())
                } else {
                    Obj::List(Vec::new())
                });
                return self.extend_top(items);
            }
            b't' => Obj::Tuple(self.pop_mark()?),
            0x85..=0x87 => Obj::Tuple(self.pop_n(usize::from(op - 0x84))?),
            b'J' => Obj::Int(i64::from(self.uint(4)? as u32 as i32)),
            b'K' => Obj::Int(self.uint(1)? as i64),
            b'M' => Obj::Int(self.uint(2)? as i64),
            0x8a | 0x8b => {
                let n = self.len(prefix(op))?;
                if n > 8 {
                    bail!("{n}-byte integer does not fit in 64 bits");
                }
                let shift = (64 - 8 * n as u32) % 64; // sign-extends n bytes
                Obj::Int(((self.uint(n)? << shift) as i64) >> shift)
            }
            b'X' | 0x8c | 0x8d => {
                let n = self.len(prefix(op))?;
                let text = std::str::from_utf8(self.take(n)?).map_err(|_| "string is not UTF-8")?;
                Obj::Str(text.to_string())
            }
            b'B' | b'C' | 0x8e => {
                let n = self.len(prefix(op))?;
                self.take(n)?;
                Obj::Bytes
            }
            b'N' => Obj::None,
            0x88 | 0x89 => Obj::Bool(op == 0x88),
            b'G' => Obj::Float(f64::from_be_bytes(arr(self.take(8)?))),
            b'Q' => {
                let pid = self.pop()?;
                self.persistent_load(pid)?
            }
            b'R' => {
                let args = self.pop()?;
                let func = self.pop()?;
                return self.reduce(func, args);
            }
            b'b' => {
                self.pop()?; // the state of an OrderedDict or tensor: unused
                return match self.objs[self.top()?] {
                    Obj::Dict(_) | Obj::Tensor(_) => Ok(()),
                    ref other => Err(format!("BUILD on {}", other.kind())),
                };
            }
            b's' | b'a' => {
                let items = self.pop_n(if op == b's' { 2 } else { 1 })?;
                return self.extend_top(items);
            }
            b'u' | b'e' => {
                let items = self.pop_mark()?;
                return self.extend_top(items);
            }
            b'q' | b'r' | 0x94 => {
                let index = match op {
                    b'q' => self.uint(1)?,
                    b'r' => self.uint(4)?,
                    _ => self.memo.len() as u64,
                };
                let top = self.top()?;
                self.memo.insert(index, top);
                return Ok(());
            }
            b'h' => return self.uint(1).and_then(|i| self.memo_get(i)),
            b'j' => return self.uint(4).and_then(|i| self.memo_get(i)),
            _ => bail!("unsupported pickle opcode {op:#04x}"),
        };
        self.push(obj);
        Ok(())
    }

    /// `('storage', storage_class, key, location, numel)`.
    fn persistent_load(&self, pid: usize) -> Result<Obj, String> {
        let Obj::Tuple(items) = &self.objs[pid] else {
            bail!("persistent id is {}, not a tuple", self.objs[pid].kind());
        };
        let &[tag, class, key, _location, numel] = items.as_slice() else {
            bail!("persistent id has {} fields, expected 5", items.len());
        };
        if self.str_of(tag)? != "storage" {
            return Err("persistent id is not a storage".into());
        }
        let Obj::Global(Global::Storage(dtype)) = self.objs[class] else {
            bail!("storage class is {}", self.objs[class].kind());
        };
        let key = self.str_of(key)?.to_string();
        let numel = self.usize_of(numel, "storage size")?;
        Ok(Obj::Storage(dtype, key, numel))
    }

    fn reduce(&mut self, func: usize, args: usize) -> Result<(), String> {
        let Obj::Global(global) = self.objs[func] else {
            bail!("REDUCE calls {}, not a global", self.objs[func].kind());
        };
        let Obj::Tuple(args) = self.objs[args].clone() else {
            bail!("REDUCE arguments are {}", self.objs[args].kind());
        };
        let obj = match (global, args.len()) {
            (Global::OrderedDict, 0) => Obj::Dict(Vec::new()),
            (Global::RebuildTensor, 6 | 7) => self.rebuild_tensor(&args)?,
            // The parameter is its tensor; requires_grad, hooks and state are dropped.
            (Global::RebuildParameter, 3 | 4) => match self.objs[args[0]] {
                Obj::Tensor(_) => {
                    self.stack.push(args[0]);
                    return Ok(());
                }
                ref other => bail!("parameter wraps {}", other.kind()),
            },
            (Global::GetLayout, 1) => Obj::Global(Global::Strided), // the only layout read
            (other, n) => bail!("cannot call {other:?} with {n} arguments"),
        };
        self.push(obj);
        Ok(())
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
    /// backward_hooks[, metadata])`; only the first four matter.
    fn rebuild_tensor(&self, args: &[usize]) -> Result<Obj, String> {
        let Obj::Storage(dtype, key, numel) = &self.objs[args[0]] else {
            bail!("tensor storage is {}", self.objs[args[0]].kind());
        };
        let offset = self.usize_of(args[1], "storage offset")?;
        let shape = self.usizes_of(args[2], "tensor size")?;
        let stride = self.usizes_of(args[3], "tensor stride")?;
        if shape.len() != stride.len() {
            bail!("size {shape:?} and stride {stride:?} differ in rank");
        }
        let bytes = checked_numel(&shape)?.checked_mul(dtype.size());
        bytes.ok_or("tensor too large")?;
        // The last element it reaches must lie inside the storage.
        let reach = |acc: usize, (&n, &s): (&usize, &usize)| match n.checked_sub(1) {
            Some(n) => n.checked_mul(s)?.checked_add(acc),
            None => Some(acc),
        };
        let last = shape.iter().zip(&stride).try_fold(offset, reach);
        if !shape.contains(&0) && last.is_none_or(|last| last >= *numel) {
            bail!(
                "view (offset {offset}, size {shape:?}, stride {stride:?}) lies outside \
                 storage `{key}` of {numel} elements"
            );
        }
        let (key, dtype, storage_numel) = (key.clone(), *dtype, *numel);
        let view = View {
            key,
            dtype,
            storage_numel,
            offset,
            shape,
            stride,
        };
        Ok(Obj::Tensor(view))
    }

    /// Whether the object or anything it contains is a tensor or storage
    /// (iterative, and safe on self-referencing containers).
    fn holds_tensor(&self, id: usize) -> bool {
        let mut seen = vec![false; self.objs.len()];
        let mut todo = vec![id];
        while let Some(id) = todo.pop() {
            if std::mem::replace(&mut seen[id], true) {
                continue;
            }
            match &self.objs[id] {
                Obj::Tensor(_) | Obj::Storage(..) => return true,
                Obj::Tuple(items) | Obj::List(items) => todo.extend(items),
                Obj::Dict(pairs) => todo.extend(pairs.iter().flat_map(|&(k, v)| [k, v])),
                _ => {}
            }
        }
        false
    }
}
