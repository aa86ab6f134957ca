//! draftc-codegen: lowering passes from the typed graph to a plan of fused kernels (see ARCHITECTURE.md).
