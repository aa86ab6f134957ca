//! The torch-free `torch.save` reader: the fixtures written by
//! tools/fixtures/torch_pickle.py (torch 2.5.1) compared exactly with the
//! values torch reported, and clear errors, never panics, on legacy,
//! truncated, corrupt and hostile files. Hostile archives are built here.

use std::io::Write;
use std::path::{Path, PathBuf};

use draftc_runtime::model::torch_pickle::{read_state_dict, TorchDtype, TorchTensor};
use serde_json::Value;
use zip::write::SimpleFileOptions;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch_pickle")
        .join(name)
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixture("state_dict.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Compares one tensor with its JSON record: shape, dtype and every value
/// bit for bit (f64 within one ulp: serde_json's float parsing may be off
/// by one).
fn check(name: &str, t: &TorchTensor, want: &Value) {
    let shape: Vec<usize> = serde_json::from_value(want["shape"].clone()).unwrap();
    assert_eq!(t.shape, shape, "{name}: shape");
    assert_eq!(
        format!("{:?}", t.dtype),
        want["dtype"].as_str().unwrap(),
        "{name}: dtype"
    );
    let values = want["values"].as_array().unwrap();
    assert_eq!(
        values.len(),
        shape.iter().product::<usize>(),
        "{name}: fixture"
    );
    assert_eq!(t.data.len(), values.len() * t.dtype.size(), "{name}: bytes");
    let f32s = t.to_f32().unwrap();
    match t.dtype {
        TorchDtype::F32 | TorchDtype::F16 | TorchDtype::BF16 | TorchDtype::F64 => {
            assert!(t.to_i64().is_err(), "{name}: floats are not integers");
            for (i, (got, want)) in f32s.iter().zip(values).enumerate() {
                let want = want.as_f64().unwrap();
                assert_eq!(
                    got.to_bits(),
                    (want as f32).to_bits(),
                    "{name}[{i}]: {got} vs {want}"
                );
            }
            if t.dtype == TorchDtype::F64 {
                for (i, (c, want)) in t.data.chunks_exact(8).zip(values).enumerate() {
                    let got = f64::from_le_bytes(c.try_into().unwrap());
                    let want = want.as_f64().unwrap();
                    assert!(
                        got.to_bits().abs_diff(want.to_bits()) <= 1,
                        "{name}[{i}]: {got} vs {want}"
                    );
                }
            }
        }
        _ => {
            let want: Vec<i64> = values.iter().map(|v| v.as_i64().unwrap()).collect();
            assert_eq!(t.to_i64().unwrap(), want, "{name}: values");
            let as_f32: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            assert_eq!(f32s, as_f32, "{name}: to_f32");
        }
    }
}

#[test]
fn state_dict_matches_torch() {
    let json = expected();
    assert!(json["torch_version"].as_str().unwrap().starts_with("2."));
    let got = read_state_dict(&fixture("state_dict.bin")).unwrap();
    let tensors = json["tensors"].as_object().unwrap();
    let mut want_names: Vec<&String> = tensors.keys().collect();
    want_names.sort();
    assert_eq!(got.keys().collect::<Vec<_>>(), want_names);
    for (name, want) in tensors {
        check(name, &got[name], want);
    }
    for skipped in json["skipped"].as_array().unwrap() {
        assert!(
            !got.contains_key(skipped.as_str().unwrap()),
            "{skipped} should be skipped"
        );
    }

    // The cases the fixture exists for, spelled out.
    assert_eq!(got["midlayer.q_proj.weight"].shape, [2, 3]);
    assert_eq!(got["scalar"].shape, Vec::<usize>::new());
    assert_eq!(got["scalar"].to_f32().unwrap(), [4.75]);
    assert_eq!(got["empty"].shape, [0, 3]);
    assert!(got["empty"].data.is_empty());
    assert_eq!(got["transposed"].shape, [3, 2]);
    assert_eq!(
        got["transposed"].to_f32().unwrap(),
        [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(got["shared_slice"].to_i64().unwrap(), [6, 9, 12, 15]);
    assert_eq!(got["shared_column"].to_i64().unwrap(), [3, 15, 27]);
    assert_eq!(got["param"].dtype, TorchDtype::BF16);
    assert_eq!(got["param"].to_f32().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(got["t2d"].to_i64().unwrap(), [1, 0, 0, 1, 1, 0]);
    assert_eq!(got["d2t"].to_i64().unwrap()[4], i64::MIN);
}

#[test]
fn pickle_protocols_4_and_5() {
    let json = expected();
    let small = json["small"].as_object().unwrap();
    for file in ["proto4.bin", "proto5.bin"] {
        let got = read_state_dict(&fixture(file)).unwrap();
        assert_eq!(got.len(), small.len(), "{file}");
        for (name, want) in small {
            check(&format!("{file}:{name}"), &got[name], want);
        }
    }
}

fn err_of(path: &Path) -> String {
    let err = read_state_dict(path).expect_err("should fail");
    assert!(
        err.contains(&path.display().to_string()),
        "error does not name the file: {err}"
    );
    err
}

#[test]
fn legacy_format_is_refused_with_advice() {
    let err = err_of(&fixture("legacy.bin"));
    assert!(
        err.contains("legacy") && err.contains("safetensors"),
        "{err}"
    );
}

#[test]
fn top_level_must_be_a_dict_of_tensors() {
    let err = err_of(&fixture("list_top.bin"));
    assert!(err.contains("a list, not a dict"), "{err}");
    let err = err_of(&fixture("nested.bin"));
    assert!(err.contains("`model` is a dict holding tensors"), "{err}");
}

/// Writes a zip of `(name, bytes)` entries into `dir` and returns its path.
fn write_zip(dir: &Path, file: &str, entries: &[(&str, &[u8])]) -> PathBuf {
    let path = dir.join(file);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    for (name, bytes) in entries {
        zip.start_file(*name, SimpleFileOptions::default()).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
    path
}

/// The entries of a fixture archive, in order.
fn entries_of(file: &str) -> Vec<(String, Vec<u8>)> {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(fixture(file)).unwrap()).unwrap();
    (0..zip.len())
        .map(|i| {
            let mut entry = zip.by_index(i).unwrap();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            (entry.name().to_string(), bytes)
        })
        .collect()
}

/// The fixture with some entries replaced (or added).
fn rewritten(dir: &Path, file: &str, replace: &[(&str, &[u8])]) -> PathBuf {
    let mut entries = entries_of("state_dict.bin");
    for (name, bytes) in replace {
        match entries.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = bytes.to_vec(),
            None => entries.push((name.to_string(), bytes.to_vec())),
        }
    }
    let refs: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    write_zip(dir, file, &refs)
}

#[test]
fn rewritten_fixture_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = rewritten(dir.path(), "same.bin", &[]);
    assert_eq!(
        read_state_dict(&path).unwrap(),
        read_state_dict(&fixture("state_dict.bin")).unwrap()
    );
}

#[test]
fn truncated_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture("state_dict.bin")).unwrap();
    let path = dir.path().join("truncated.bin");
    for len in (0..bytes.len())
        .step_by(13)
        .chain(bytes.len() - 30..bytes.len())
    {
        std::fs::write(&path, &bytes[..len]).unwrap();
        err_of(&path);
    }
}

#[test]
fn corrupt_pickles_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let pickle = entries_of("state_dict.bin")
        .into_iter()
        .find(|(n, _)| n == "state_dict/data.pkl")
        .unwrap()
        .1;
    for len in (0..pickle.len()).step_by(3) {
        let path = rewritten(
            dir.path(),
            "cut.bin",
            &[("state_dict/data.pkl", &pickle[..len])],
        );
        let err = err_of(&path);
        assert!(err.contains("data.pkl"), "{err}");
    }
    // Flipped bytes: any result is fine but a panic.
    for at in (0..pickle.len()).step_by(2) {
        for value in [0xff, pickle[at] ^ 0x01] {
            let mut bad = pickle.clone();
            bad[at] = value;
            let path = rewritten(dir.path(), "flipped.bin", &[("state_dict/data.pkl", &bad)]);
            if let Err(e) = read_state_dict(&path) {
                assert!(e.contains("flipped.bin"), "{e}");
            }
        }
    }
}

#[test]
fn storage_shorter_than_declared_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = rewritten(
        dir.path(),
        "short.bin",
        &[("state_dict/data/0", &[0u8; 20])],
    );
    let err = err_of(&path);
    assert!(
        err.contains("storage `0`") && err.contains("20 bytes"),
        "{err}"
    );
    let path = rewritten(dir.path(), "missing.bin", &[("state_dict/data/0", &[])]);
    err_of(&path);
}

#[test]
fn big_endian_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = rewritten(dir.path(), "big.bin", &[("state_dict/byteorder", b"big")]);
    let err = err_of(&path);
    assert!(err.contains("big-endian"), "{err}");
}

#[test]
fn zip_without_data_pkl_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_zip(dir.path(), "nopkl.bin", &[("archive/version", b"3\n")]);
    let err = err_of(&path);
    assert!(err.contains("data.pkl"), "{err}");
    let path = write_zip(dir.path(), "nested.bin", &[("a/b/data.pkl", b"\x80\x02}.")]);
    assert!(err_of(&path).contains("data.pkl"));
    let path = dir.path().join("text.bin");
    std::fs::write(&path, "hello").unwrap();
    assert!(err_of(&path).contains("no zip signature"));
    assert!(err_of(&dir.path().join("absent.bin")).contains("cannot open"));
}

fn pickle_err(pickle: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write_zip(dir.path(), "hostile.bin", &[("archive/data.pkl", pickle)]);
    err_of(&path)
}

#[test]
fn non_whitelisted_globals_are_refused() {
    // GLOBAL 'os system', then ('ls',), REDUCE, STOP.
    let err = pickle_err(b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.");
    assert!(err.contains("`os.system`"), "{err}");
    // STACK_GLOBAL 'builtins' 'eval' (protocol 4).
    let err = pickle_err(b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.");
    assert!(err.contains("`builtins.eval`"), "{err}");
    // A whitelisted module with another name.
    let err = pickle_err(b"\x80\x02ctorch._utils\n_rebuild_from_type_v2\n.");
    assert!(
        err.contains("`torch._utils._rebuild_from_type_v2`"),
        "{err}"
    );
}

#[test]
fn hand_built_pickles() {
    let err = pickle_err(b"\x80\x02\xff.");
    assert!(
        err.contains("opcode 0xff") && err.contains("byte 2"),
        "{err}"
    );
    let err = pickle_err(b"\x80\x02K\x05.");
    assert!(err.contains("an int, not a dict"), "{err}");
    let err = pickle_err(b"\x80\x02}");
    assert!(err.contains("before STOP"), "{err}");
    let err = pickle_err(b"\x80\x02u.");
    assert!(err.contains("MARK"), "{err}");
    let err = pickle_err(b"\x80\x02h\x07.");
    assert!(err.contains("memo"), "{err}");
    // An empty dict is an empty state dict; non-tensor values are skipped.
    let dir = tempfile::tempdir().unwrap();
    let path = write_zip(
        dir.path(),
        "empty.bin",
        &[("archive/data.pkl", b"\x80\x02}.")],
    );
    assert!(read_state_dict(&path).unwrap().is_empty());
    let dict = b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bNu.";
    let path = write_zip(dir.path(), "plain.bin", &[("archive/data.pkl", dict)]);
    assert!(read_state_dict(&path).unwrap().is_empty());
    // A list that contains itself holds no tensor and is skipped.
    let cyclic = b"\x80\x02}X\x01\x00\x00\x00l]q\x00h\x00as.";
    let path = write_zip(dir.path(), "cyclic.bin", &[("archive/data.pkl", cyclic)]);
    assert!(read_state_dict(&path).unwrap().is_empty());
}

#[test]
fn view_outside_its_storage_is_an_error() {
    // The fixture's first tensor (2x3 f32 in storage `0` of 6 elements)
    // with its offset byte (BININT1 0 after BINPERSID) set to 1.
    let dir = tempfile::tempdir().unwrap();
    let mut pickle = entries_of("state_dict.bin")
        .into_iter()
        .find(|(n, _)| n == "state_dict/data.pkl")
        .unwrap()
        .1;
    let at = pickle.iter().position(|&b| b == b'Q').unwrap();
    assert_eq!(&pickle[at + 1..at + 3], b"K\x00");
    pickle[at + 2] = 1;
    let path = rewritten(
        dir.path(),
        "offset.bin",
        &[("state_dict/data.pkl", &pickle)],
    );
    let err = err_of(&path);
    assert!(err.contains("outside storage `0`"), "{err}");
}
