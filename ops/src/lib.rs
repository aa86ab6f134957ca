//! draftc-ops: the CubeCL kernels draftc launches, each with a plain-Rust
//! reference implementation that serves as its test oracle.
