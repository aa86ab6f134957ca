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
    /// Number of elements (1 for a 0-d tensor).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The data split into elements, after checking its length.
    fn elements(&self) -> Result<std::slice::ChunksExact<'_, u8>, String> {
        let numel = checked_numel(&self.shape)?;
        let size = self.dtype.size();
        if numel.checked_mul(size) != Some(self.data.len()) {
            return Err(format!(
                "tensor of shape {:?} and dtype {:?} has {} bytes of data",
                self.shape,
                self.dtype,
                self.data.len()
            ));
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
            float => return Err(format!("tensor is {float:?}, not an integer or bool tensor")),
        })
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

/// The pickled magic number that starts a legacy (torch < 1.6) checkpoint.
const LEGACY_MAGIC: [u8; 14] = [
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
];

fn read(path: &Path) -> Result<BTreeMap<String, TorchTensor>, String> {
    let mut file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let file_len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut head = [0u8; 14];
    let got = read_up_to(&mut file, &mut head)?;
    if !head[..got].starts_with(b"PK") || got < 4 {
        return Err(if head.starts_with(&LEGACY_MAGIC) || head[..got].starts_with(&[0x80]) {
            "legacy (pre-1.6, non-zip) PyTorch checkpoint; re-save it with torch >= 1.6 \
             (`torch.save(torch.load(f), f)`) or convert it to safetensors"
                .to_string()
        } else {
            "not a PyTorch zip checkpoint (no zip signature)".to_string()
        });
    }
    let mut zip = zip::ZipArchive::new(file).map_err(|e| format!("bad zip archive: {e}"))?;
    let prefix = find_prefix(&zip)?;
    if zip.index_for_name(&format!("{prefix}/byteorder")).is_some() {
        let order = read_entry(&mut zip, &format!("{prefix}/byteorder"), file_len)?;
        match order.trim_ascii() {
            b"little" => {}
            b"big" => return Err("big-endian checkpoint (byteorder `big`) is not supported".into()),
            other => {
                let shown = String::from_utf8_lossy(other);
                return Err(format!("unknown byteorder `{shown}`"));
            }
        }
    }
    let pickle = read_entry(&mut zip, &format!("{prefix}/data.pkl"), file_len)?;
    let mut vm = Vm { data: &pickle, pos: 0, objs: Vec::new(), stack: Vec::new(), marks: Vec::new(), memo: HashMap::new() };
    let top = vm.run()?;
    let Obj::Dict(items) = &vm.objs[top] else {
        return Err(format!("top-level object is {}, not a dict of tensors", vm.objs[top].kind()));
    };
    let mut views: BTreeMap<String, &View> = BTreeMap::new();
    for &(k, v) in items {
        let name = match &vm.objs[k] {
            Obj::Str(s) => Some(s),
            _ => None,
        };
        match (name, &vm.objs[v]) {
            (Some(name), Obj::Tensor(view)) => {
                views.insert(name.clone(), view);
            }
            _ if !vm.holds_tensor(v) => {}
            (None, _) => return Err(format!("a tensor is stored under {}, not a string key", vm.objs[k].kind())),
            (Some(name), value) => {
                return Err(format!(
                    "value for `{name}` is {} holding tensors, not a tensor (nested state dicts are not supported)",
                    value.kind()
                ))
            }
        }
    }
    // One storage in memory at a time; a tensor that is a whole storage on
    // its own takes the bytes without a copy.
    let mut by_storage: BTreeMap<&str, Vec<(&String, &View)>> = BTreeMap::new();
    for (name, view) in &views {
        by_storage.entry(view.key.as_str()).or_default().push((name, view));
    }
    let mut out = BTreeMap::new();
    for (key, users) in by_storage {
        let mut bytes = read_entry(&mut zip, &format!("{prefix}/data/{key}"), file_len)?;
        let single = users.len() == 1;
        for (name, view) in users {
            let expect = view.storage_numel.checked_mul(view.dtype.size());
            if expect != Some(bytes.len()) {
                return Err(format!(
                    "storage `{key}` of `{name}` has {} bytes, expected {} {:?} elements",
                    bytes.len(),
                    view.storage_numel,
                    view.dtype
                ));
            }
            let data = if single && view.is_whole_storage() {
                std::mem::take(&mut bytes)
            } else {
                view.gather(&bytes).map_err(|e| format!("tensor `{name}`: {e}"))?
            };
            out.insert(name.clone(), TorchTensor { shape: view.shape.clone(), dtype: view.dtype, data });
        }
    }
    Ok(out)
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> Result<usize, String> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(format!("cannot read: {e}")),
        }
    }
    Ok(got)
}

/// The one top-level folder holding `data.pkl`.
fn find_prefix(zip: &zip::ZipArchive<File>) -> Result<String, String> {
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
        many => Err(format!("several `data.pkl` in the zip archive (folders {many:?})")),
    }
}

fn read_entry(zip: &mut zip::ZipArchive<File>, name: &str, file_len: u64) -> Result<Vec<u8>, String> {
    let mut entry = zip.by_name(name).map_err(|e| format!("zip entry `{name}`: {e}"))?;
    let mut buf = Vec::new();
    let hint = entry.size().min(file_len).min(usize::MAX as u64) as usize;
    buf.try_reserve_exact(hint).map_err(|e| format!("zip entry `{name}`: {e}"))?;
    entry.read_to_end(&mut buf).map_err(|e| format!("zip entry `{name}`: {e}"))?;
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
        _ => return Err(format!(
            "refusing pickle global `{module}.{name}`: only tensors, storages and OrderedDict are allowed"
        )),
    })
}

/// A tensor before materialisation: a strided view of one storage.
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

    fn is_whole_storage(&self) -> bool {
        self.offset == 0 && self.is_contiguous() && self.shape.iter().product::<usize>() == self.storage_numel
    }

    /// Copies the view out of `bytes` (already checked to hold the storage,
    /// and the view to lie inside it) in row-major order.
    fn gather(&self, bytes: &[u8]) -> Result<Vec<u8>, String> {
        let es = self.dtype.size();
        let numel = checked_numel(&self.shape)?;
        let total = numel.checked_mul(es).ok_or("tensor too large")?;
        let mut out = Vec::new();
        out.try_reserve_exact(total).map_err(|e| format!("cannot allocate {total} bytes: {e}"))?;
        if numel == 0 {
            return Ok(out);
        }
        let nd = self.shape.len();
        let (inner, inner_stride) = match nd {
            0 => (1, 0),
            _ => (self.shape[nd - 1], self.stride[nd - 1]),
        };
        let outer = &self.shape[..nd.saturating_sub(1)];
        let mut idx = vec![0usize; outer.len()];
        let slice = |first: usize, count: usize| {
            bytes.get(first * es..(first + count) * es).ok_or_else(|| "view outside its storage".to_string())
        };
        loop {
            let base = self.offset + idx.iter().zip(&self.stride).map(|(i, s)| i * s).sum::<usize>();
            if inner_stride == 1 {
                out.extend_from_slice(slice(base, inner)?);
            } else {
                for j in 0..inner {
                    out.extend_from_slice(slice(base + j * inner_stride, 1)?);
                }
            }
            let mut d = outer.len();
            loop {
                if d == 0 {
                    return Ok(out);
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < outer[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

/// A pickled object; containers refer to others by index in `Vm::objs`, so
/// a memoised dict or list mutated later is shared as in Python.
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
    Layout,
    Storage { dtype: TorchDtype, key: String, numel: usize },
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
            Obj::Layout => "a layout",
            Obj::Storage { .. } => "a storage",
            Obj::Tensor(_) => "a tensor",
        }
    }
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    objs: Vec<Obj>,
    stack: Vec<usize>,
    marks: Vec<usize>,
    memo: HashMap<u64, usize>,
}

impl Vm<'_> {
    /// Runs to STOP and returns the result's index.
    fn run(&mut self) -> Result<usize, String> {
        loop {
            let at = self.pos;
            let op = self.take(1).map_err(|_| "pickle ends before STOP (truncated data.pkl)".to_string())?[0];
            match self.step(op) {
                Ok(true) => return self.pop().map_err(|e| format!("data.pkl at STOP: {e}")),
                Ok(false) => {}
                Err(e) => return Err(format!("data.pkl byte {at} (opcode {op:#04x}): {e}")),
            }
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| format!("needs {n} bytes, truncated data.pkl"))?;
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn uint(&mut self, n: usize) -> Result<u64, String> {
        Ok(self.take(n)?.iter().rev().fold(0u64, |acc, &b| (acc << 8) | b as u64))
    }

    fn len(&mut self, n: usize) -> Result<usize, String> {
        usize::try_from(self.uint(n)?).map_err(|_| "length too large".to_string())
    }

    fn line(&mut self) -> Result<String, String> {
        let rest = &self.data[self.pos..];
        let end = rest.iter().position(|&b| b == b'\n').ok_or("unterminated GLOBAL line")?;
        let text = std::str::from_utf8(&rest[..end]).map_err(|_| "GLOBAL name is not UTF-8")?.to_string();
        self.pos += end + 1;
        Ok(text)
    }

    fn string(&mut self, n: usize) -> Result<Obj, String> {
        let bytes = self.take(n)?;
        let text = std::str::from_utf8(bytes).map_err(|_| "string is not valid UTF-8")?;
        Ok(Obj::Str(text.to_string()))
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
        let mut items: Vec<usize> = (0..n).map(|_| self.pop()).collect::<Result<_, _>>()?;
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
        self.stack.last().copied().ok_or_else(|| "empty stack".into())
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
            Obj::Tuple(items) | Obj::List(items) => items.iter().map(|&i| self.usize_of(i, what)).collect(),
            other => Err(format!("{what} is {}, not a tuple", other.kind())),
        }
    }

    fn set_items(&mut self, dict: usize, items: Vec<usize>) -> Result<(), String> {
        if items.len() % 2 != 0 {
            return Err("odd number of items for a dict".into());
        }
        let Obj::Dict(pairs) = &mut self.objs[dict] else {
            return Err(format!("SETITEM(S) on {}", self.objs[dict].kind()));
        };
        pairs.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
        Ok(())
    }

    fn append(&mut self, list: usize, items: Vec<usize>) -> Result<(), String> {
        let Obj::List(existing) = &mut self.objs[list] else {
            return Err(format!("APPEND(S) on {}", self.objs[list].kind()));
        };
        existing.extend(items);
        Ok(())
    }

    fn memo_put(&mut self, index: u64) -> Result<bool, String> {
        let top = self.top()?;
        self.memo.insert(index, top);
        Ok(false)
    }

    fn memo_get(&mut self, index: u64) -> Result<bool, String> {
        let id = *self.memo.get(&index).ok_or_else(|| format!("memo entry {index} is missing"))?;
        self.stack.push(id);
        Ok(false)
    }

    /// One opcode; true at STOP.
    fn step(&mut self, op: u8) -> Result<bool, String> {
        let obj = match op {
            b'.' => return Ok(true),
            0x80 => match self.uint(1)? {
                2..=5 => return Ok(false),
                p => return Err(format!("unsupported pickle protocol {p}")),
            },
            0x95 => return self.take(8).map(|_| false),
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
                return Ok(false);
            }
            b'0' => return self.pop().map(|_| false),
            b'1' => return self.pop_mark().map(|_| false),
            b'2' => {
                let top = self.top()?;
                self.stack.push(top);
                return Ok(false);
            }
            b'}' => Obj::Dict(Vec::new()),
            b']' => Obj::List(Vec::new()),
            b')' => Obj::Tuple(Vec::new()),
            b'd' => {
                let items = self.pop_mark()?;
                self.push(Obj::Dict(Vec::new()));
                let dict = self.top()?;
                self.set_items(dict, items)?;
                return Ok(false);
            }
            b'l' => Obj::List(self.pop_mark()?),
            b't' => Obj::Tuple(self.pop_mark()?),
            0x85..=0x87 => Obj::Tuple(self.pop_n((op - 0x84) as usize)?),
            b'J' => Obj::Int(self.uint(4)? as u32 as i32 as i64),
            b'K' => Obj::Int(self.uint(1)? as i64),
            b'M' => Obj::Int(self.uint(2)? as i64),
            0x8a | 0x8b => {
                let n = if op == 0x8a { self.len(1)? } else { self.len(4)? };
                if n > 8 {
                    return Err(format!("{n}-byte integer does not fit in 64 bits"));
                }
                let raw = self.uint(n)?;
                let shift = 64 - 8 * n as u32;
                Obj::Int(if n == 0 { 0 } else { ((raw << shift) as i64) >> shift })
            }
            b'X' => {
                let n = self.len(4)?;
                self.string(n)?
            }
            0x8c => {
                let n = self.len(1)?;
                self.string(n)?
            }
            0x8d => {
                let n = self.len(8)?;
                self.string(n)?
            }
            b'B' | b'C' | 0x8e => {
                let n = match op {
                    b'B' => self.len(4)?,
                    b'C' => self.len(1)?,
                    _ => self.len(8)?,
                };
                self.take(n)?;
                Obj::Bytes
            }
            b'N' => Obj::None,
            0x88 => Obj::Bool(true),
            0x89 => Obj::Bool(false),
            b'G' => Obj::Float(f64::from_be_bytes(arr(self.take(8)?))),
            b'Q' => {
                let pid = self.pop()?;
                self.persistent_load(pid)?
            }
            b'R' => {
                let args = self.pop()?;
                let func = self.pop()?;
                return self.reduce(func, args).map(|_| false);
            }
            b'b' => {
                self.pop()?;
                return match self.objs[self.top()?] {
                    Obj::Dict(_) | Obj::Tensor(_) => Ok(false),
                    ref other => Err(format!("BUILD on {}", other.kind())),
                };
            }
            b's' => {
                let kv = self.pop_n(2)?;
                let dict = self.top()?;
                return self.set_items(dict, kv).map(|_| false);
            }
            b'u' => {
                let items = self.pop_mark()?;
                let dict = self.top()?;
                return self.set_items(dict, items).map(|_| false);
            }
            b'a' => {
                let item = self.pop()?;
                let list = self.top()?;
                return self.append(list, vec![item]).map(|_| false);
            }
            b'e' => {
                let items = self.pop_mark()?;
                let list = self.top()?;
                return self.append(list, items).map(|_| false);
            }
            b'q' => {
                let i = self.uint(1)?;
                return self.memo_put(i);
            }
            b'r' => {
                let i = self.uint(4)?;
                return self.memo_put(i);
            }
            0x94 => return self.memo_put(self.memo.len() as u64),
            b'h' => {
                let i = self.uint(1)?;
                return self.memo_get(i);
            }
            b'j' => {
                let i = self.uint(4)?;
                return self.memo_get(i);
            }
            _ => return Err(format!("unsupported pickle opcode {op:#04x}")),
        };
        self.push(obj);
        Ok(false)
    }

    /// `('storage', storage_class, key, location, numel)`.
    fn persistent_load(&self, pid: usize) -> Result<Obj, String> {
        let Obj::Tuple(items) = &self.objs[pid] else {
            return Err(format!("persistent id is {}, not a tuple", self.objs[pid].kind()));
        };
        let [tag, class, key, _location, numel] = items.as_slice() else {
            return Err(format!("persistent id has {} fields, expected 5", items.len()));
        };
        if self.str_of(*tag)? != "storage" {
            return Err("persistent id is not a storage".into());
        }
        let Obj::Global(Global::Storage(dtype)) = self.objs[*class] else {
            return Err(format!("storage class is {}", self.objs[*class].kind()));
        };
        let key = self.str_of(*key)?.to_string();
        Ok(Obj::Storage { dtype, key, numel: self.usize_of(*numel, "storage size")? })
    }

    fn reduce(&mut self, func: usize, args: usize) -> Result<(), String> {
        let Obj::Global(global) = self.objs[func] else {
            return Err(format!("REDUCE calls {}, not a global", self.objs[func].kind()));
        };
        let Obj::Tuple(args) = self.objs[args].clone() else {
            return Err(format!("REDUCE arguments are {}", self.objs[args].kind()));
        };
        let obj = match global {
            Global::OrderedDict if args.is_empty() => Obj::Dict(Vec::new()),
            Global::RebuildTensor if (6..=7).contains(&args.len()) => self.rebuild_tensor(&args)?,
            Global::RebuildParameter if (3..=4).contains(&args.len()) => match self.objs[args[0]] {
                Obj::Tensor(_) => {
                    self.stack.push(args[0]);
                    return Ok(());
                }
                ref other => return Err(format!("parameter wraps {}, not a tensor", other.kind())),
            },
            Global::GetLayout => Obj::Layout,
            other => return Err(format!("cannot call {other:?} with {} arguments", args.len())),
        };
        self.push(obj);
        Ok(())
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
    /// backward_hooks[, metadata])`, checked to lie inside the storage.
    fn rebuild_tensor(&self, args: &[usize]) -> Result<Obj, String> {
        let Obj::Storage { dtype, key, numel } = &self.objs[args[0]] else {
            return Err(format!("tensor storage is {}", self.objs[args[0]].kind()));
        };
        let offset = self.usize_of(args[1], "storage offset")?;
        let shape = self.usizes_of(args[2], "tensor size")?;
        let stride = self.usizes_of(args[3], "tensor stride")?;
        if shape.len() != stride.len() {
            return Err(format!("size {shape:?} and stride {stride:?} differ in rank"));
        }
        let elements = checked_numel(&shape)?;
        elements.checked_mul(dtype.size()).ok_or("tensor too large")?;
        if elements > 0 {
            let last = shape.iter().zip(&stride).try_fold(offset, |acc, (&n, &s)| {
                (n - 1).checked_mul(s).and_then(|d| acc.checked_add(d))
            });
            if last.is_none_or(|last| last >= *numel) {
                return Err(format!(
                    "view (offset {offset}, size {shape:?}, stride {stride:?}) lies outside storage `{key}` of {numel} elements"
                ));
            }
        }
        let view = View { key: key.clone(), dtype: *dtype, storage_numel: *numel, offset, shape, stride };
        Ok(Obj::Tensor(view))
    }

    /// Whether the object or anything it contains is a tensor or storage.
    fn holds_tensor(&self, id: usize) -> bool {
        let mut seen = vec![false; self.objs.len()];
        let mut todo = vec![id];
        while let Some(id) = todo.pop() {
            if std::mem::replace(&mut seen[id], true) {
                continue;
            }
            match &self.objs[id] {
                Obj::Tensor(_) | Obj::Storage { .. } => return true,
                Obj::Tuple(items) | Obj::List(items) => todo.extend(items),
                Obj::Dict(pairs) => todo.extend(pairs.iter().flat_map(|&(k, v)| [k, v])),
                _ => {}
            }
        }
        false
    }
}
