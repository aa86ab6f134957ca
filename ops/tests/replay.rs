//! Recorded passes (`draftc_ops::replay`): a replayed pass equals the same
//! pass run eagerly, bit for bit, after its one upload is rewritten with
//! new data; the capture window refuses a pass that allocates, reads back
//! or uploads into a new buffer; a replay refuses to run over a buffer
//! someone still holds.

use cubecl::prelude::*;
use draftc_ops::embedding::embedding_clamped;
use draftc_ops::kept;
use draftc_ops::replay::{self, Flushes, NotReplayable, Recording, ReplayError};
use draftc_ops::testing::{config, random_f32, random_u32, test_client, TestRuntime};
use draftc_ops::{DType, DeviceTensor};
use proptest::prelude::*;

type Client = ComputeClient<TestRuntime>;

/// [`replay::record`] with flushes refused, flushed after the window.
fn record<T>(
    client: &Client,
    f: impl FnOnce() -> T,
) -> Result<(T, Result<Recording<TestRuntime>, NotReplayable>), draftc_ops::OpsError> {
    let out = replay::record(client, Flushes::Forbid, f);
    draftc_ops::launch::flush(client, "test")?;
    Ok(out)
}

/// A small "step": ids (the one upload) → embedding → RMSNorm → SiLU.
struct Pass {
    table: DeviceTensor<TestRuntime>,
    weight: DeviceTensor<TestRuntime>,
    rows: usize,
    d: usize,
    dtype: DType,
}

impl Pass {
    fn new(client: &Client, vocab: usize, rows: usize, d: usize, dtype: DType, seed: u64) -> Self {
        let table = random_f32(seed, vocab * d, -2.0, 2.0, dtype);
        let weight = random_f32(seed + 1, d, 0.5, 1.5, dtype);
        Pass {
            table: DeviceTensor::upload_f32(client, &table, &[vocab, d], dtype).unwrap(),
            weight: DeviceTensor::upload_f32(client, &weight, &[d], dtype).unwrap(),
            rows,
            d,
            dtype,
        }
    }

    /// Uploads `ids` and launches; the output.
    fn run(&self, client: &Client, ids: &[u32]) -> DeviceTensor<TestRuntime> {
        let ids = DeviceTensor::upload_u32(client, ids, &[self.rows]).unwrap();
        let e = DeviceTensor::empty(client, &[self.rows, self.d], self.dtype);
        embedding_clamped(client, &self.table, &ids, &e).unwrap();
        let n = DeviceTensor::empty(client, &[self.rows, self.d], self.dtype);
        draftc_ops::rms_norm::rms_norm(client, &e, &self.weight, 1e-5, &n).unwrap();
        let out = DeviceTensor::empty(client, &[self.rows, self.d], self.dtype);
        draftc_ops::elementwise::silu(client, &n, &out).unwrap();
        out
    }
}

/// The kept buffer behind `t` among `rec`'s, as a tensor of `t`'s shape.
fn kept_view(
    rec: &Recording<TestRuntime>,
    id: usize,
    shape: &[usize],
    dtype: DType,
) -> DeviceTensor<TestRuntime> {
    let r = rec
        .kept()
        .iter()
        .find(|r| kept::handle(r).unwrap().memory_id() == id)
        .expect("the output is one of the recording's kept buffers");
    let h = kept::handle(r).unwrap();
    let bytes = draftc_ops::tensor::padded_bytes(shape.iter().product(), dtype);
    let class = h.size_in_used();
    DeviceTensor::from_handle(h.offset_end(class - bytes as u64), shape, dtype).unwrap()
}

/// Records the pass on `first` ids, then replays it on each of `later`:
/// every replay reads back what the eager pass gives on the same ids.
fn check_replay(vocab: usize, rows: usize, d: usize, dtype: DType, seed: u64) {
    let client = test_client();
    let pass = Pass::new(&client, vocab, rows, d, dtype, seed);
    let first = random_u32(seed + 2, rows, vocab as u32);
    // A warm-up: the first pass makes the kept buffers (allocations).
    drop(pass.run(&client, &first));
    let (out, rec) = record(&client, || pass.run(&client, &first)).unwrap();
    let rec = rec.expect("the pass is replayable");
    assert_eq!(rec.launches(), 3);
    assert_eq!(rec.writes().len(), 1);
    let (id, shape) = (out.handle.memory_id(), out.shape().to_vec());
    let recorded = out.download_f32(&client).unwrap();
    drop(out);
    assert_eq!(
        recorded,
        pass.run(&client, &first).download_f32(&client).unwrap()
    );
    for k in 0..3 {
        let ids = random_u32(seed + 10 + k, rows, vocab as u32);
        rec.replay(
            &client,
            vec![draftc_ops::tensor::u32_bytes(&ids)],
            k % 2 == 0,
        )
        .expect("nothing holds the recording's buffers")
        .unwrap();
        let replayed = kept_view(&rec, id, &shape, dtype)
            .download_f32(&client)
            .unwrap();
        let eager = pass.run(&client, &ids).download_f32(&client).unwrap();
        assert_eq!(
            replayed.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            eager.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "replay {k} differs from the eager pass"
        );
    }
}

proptest! {
    #![proptest_config(config(6))]

    #[test]
    fn a_replayed_pass_equals_the_eager_pass(
        vocab in 2usize..40,
        rows in 1usize..9,
        d in 1usize..70,
        half in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dtype = if half { DType::F16 } else { DType::F32 };
        check_replay(vocab, rows, d, dtype, seed >> 8);
    }
}

/// Two recordings of the same pass shape on different data are the same
/// launches; another row count is not, and says where.
#[test]
fn recordings_compare_by_launches_not_data() {
    let client = test_client();
    let pass = Pass::new(&client, 11, 3, 16, DType::F32, 7);
    drop(pass.run(&client, &[0, 0, 0]));
    let rec = |ids: &[u32]| {
        record(&client, || drop(pass.run(&client, ids)))
            .unwrap()
            .1
            .unwrap()
    };
    let a = rec(&[1, 2, 3]);
    let b = rec(&[4, 5, 6]);
    assert!(a.same_as(&b));
    assert_eq!(a.first_difference(&b), None);
    let other = Pass::new(&client, 11, 4, 16, DType::F32, 7);
    drop(other.run(&client, &[0; 4]));
    let c = record(&client, || drop(other.run(&client, &[1, 2, 3, 4])))
        .unwrap()
        .1
        .unwrap();
    assert!(!a.same_as(&c));
    assert!(a.first_difference(&c).is_some());
}

/// A read, an allocation or an upload into a new buffer inside the window
/// makes the pass not replayable, with the reason.
#[test]
fn the_window_refuses_what_a_replay_would_skip() {
    let client = test_client();
    let pass = Pass::new(&client, 11, 2, 8, DType::F32, 3);
    drop(pass.run(&client, &[0, 0]));
    let (_, r) = record(&client, || pass.run(&client, &[1, 2]).download_f32(&client)).unwrap();
    assert!(
        matches!(
            r,
            Err(NotReplayable::Forbidden {
                what: "read back",
                n: 1
            })
        ),
        "{:?}",
        r.err()
    );
    let big = kept::MAX_KEPT_BYTES / 4 + 1;
    let (_, r) = record(&client, || DeviceTensor::empty(&client, &[big], DType::F32)).unwrap();
    assert!(
        matches!(
            r,
            Err(NotReplayable::Forbidden {
                what: "allocated",
                ..
            })
        ),
        "{:?}",
        r.err()
    );
    let (_, r) = record(&client, || {
        DeviceTensor::upload_f32(&client, &[1.0; 4], &[4], DType::F32).unwrap()
    })
    .unwrap();
    assert!(
        matches!(r, Err(NotReplayable::Forbidden { .. })),
        "{:?}",
        r.err()
    );
    let nested = || replay::record(&client, Flushes::Forbid, || ()).1.err();
    let (inner, outer) = replay::record(&client, Flushes::Forbid, nested);
    assert!(outer.is_ok());
    assert_eq!(inner, Some(NotReplayable::Nested));
    let flush = || draftc_ops::launch::flush(&client, "test").unwrap();
    let (_, r) = replay::record(&client, Flushes::Forbid, flush);
    assert!(
        matches!(
            r,
            Err(NotReplayable::Forbidden {
                what: "flushed",
                n: 1
            })
        ),
        "{:?}",
        r.err()
    );
    assert!(replay::record(&client, Flushes::Allow, flush).1.is_ok());
}

/// A replay over a buffer the caller still holds (last pass's output)
/// issues nothing and says so; data that do not fit the writes too.
#[test]
fn a_replay_refuses_held_buffers_and_misfit_data() {
    let client = test_client();
    let pass = Pass::new(&client, 11, 2, 8, DType::F32, 5);
    drop(pass.run(&client, &[0, 0]));
    let (out, rec) = record(&client, || pass.run(&client, &[1, 2])).unwrap();
    let rec = rec.unwrap();
    let bytes = draftc_ops::tensor::u32_bytes(&[3, 4]);
    assert_eq!(
        rec.replay(&client, vec![bytes.clone()], false).err(),
        Some(ReplayError::Busy)
    );
    drop(out);
    assert!(matches!(
        rec.replay(&client, vec![bytes[..4].to_vec()], false).err(),
        Some(ReplayError::WriteSize { .. })
    ));
    assert!(matches!(
        rec.replay(&client, vec![], false).err(),
        Some(ReplayError::Writes {
            expected: 1,
            found: 0
        })
    ));
    rec.replay(&client, vec![bytes], false).unwrap().unwrap();
}

/// A pass that makes its kept buffers on first use records all the same:
/// they stay in the pool and are what its replay binds. A buffer that is
/// not kept is refused (`the_window_refuses_what_a_replay_would_skip`).
#[test]
fn kept_buffers_made_inside_the_window_are_the_recordings() {
    let client = test_client();
    // Widths no other test here uses: classes this thread has not made.
    let pass = Pass::new(&client, 13, 5, 3001, DType::F32, 9);
    let (out, rec) = record(&client, || pass.run(&client, &[1, 2, 3, 4, 5])).unwrap();
    let rec = rec.expect("kept buffers made on first use are allowed");
    let (id, shape) = (out.handle.memory_id(), out.shape().to_vec());
    drop(out);
    let ids = [6, 7, 8, 9, 10];
    rec.replay(&client, vec![draftc_ops::tensor::u32_bytes(&ids)], false)
        .unwrap()
        .unwrap();
    let replayed = kept_view(&rec, id, &shape, DType::F32)
        .download_f32(&client)
        .unwrap();
    assert_eq!(
        replayed,
        pass.run(&client, &ids).download_f32(&client).unwrap()
    );
}
