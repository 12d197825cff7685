// Every op schema of replayssm, once. Implementations register per backend (mamba2/ops.cpp);
// fake (meta) kernels for torch.compile are registered in Python (replayssm/ops.py).
#include <Python.h>
#include <torch/library.h>

// Importing replayssm._C loads this library and so registers the ops; the module itself is empty.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

TORCH_LIBRARY(replayssm, m) {
  // Standard decode step: reads and writes state[slot_ids[b]] in place, writes out.
  m.def(
      "mamba2_step(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? dt_bias, bool dt_softplus, float dt_min, float dt_max, Tensor slot_ids, Tensor(b!) out, "
      "Tensor? dst_slot_ids=None) -> ()");
  // Replay decode step: output from checkpoint + ring; appends to the ring, or folds when it is full (or, with the
  // cache's fold_phase, when the phase says so: aligned folds, common/math.h).
  m.def(
      "mamba2_replay_step(Tensor(a!) checkpoint, Tensor(b!) ring_x, Tensor(c!) ring_B, Tensor(d!) ring_dt, "
      "Tensor(e!) cursor, Tensor(f!) arrivals, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? dt_bias, bool dt_softplus, float dt_min, float dt_max, Tensor slot_ids, Tensor(g!) out, "
      "Tensor(h!)? view=None, Tensor? sr_seed=None, Tensor(i!)? fold_count=None, Tensor(j!)? fold_phase=None) -> ()");
  // Round x to dtype stochastically (Philox keyed by seed, counter (element, fold)): the folds' rounding, exposed.
  m.def("stochastic_round(Tensor x, int seed, int fold, ScalarType dtype) -> Tensor");
  // The state of each slot at its cursor, or at a committed position (<= cursor), fp32, into out.
  m.def(
      "mamba2_replay_state(Tensor checkpoint, Tensor ring_x, Tensor ring_B, Tensor ring_dt, Tensor cursor, Tensor A, "
      "Tensor slot_ids, Tensor? positions, Tensor(a!) out) -> ()");
  // Speculative verification of T tentative tokens per row (x: (batch, T, nheads, headdim)): outputs from the
  // checkpoint and the ring, tokens written into the ring after the cursor; early fold when they would not fit.
  m.def(
      "mamba2_replay_verify(Tensor(a!) checkpoint, Tensor(b!) ring_x, Tensor(c!) ring_B, Tensor(d!) ring_dt, "
      "Tensor(e!) cursor, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? dt_bias, "
      "bool dt_softplus, float dt_min, float dt_max, Tensor slot_ids, Tensor? num_tokens, Tensor(f!) out, "
      "Tensor(g!)? pending=None, Tensor(h!)? arrivals=None, Tensor(i!)? view=None, Tensor? sr_seed=None, "
      "Tensor(j!)? fold_count=None) -> ()");
  // Accept tokens of the last verify: cursor[slot] += accepted (rejected ones are overwritten later). With
  // `pending` (the window sizes verify recorded), accepted counts beyond the window are an error (CPU) or
  // clamped (GPU). Works for any replay cache (Mamba-2 or GDN).
  m.def("mamba2_replay_commit(Tensor(a!) cursor, int ring_len, Tensor slot_ids, Tensor accepted, "
        "Tensor(b!)? pending=None) -> ()");
  // The short causal convolution under speculation: outputs of T tentative inputs from the conv state, the
  // inputs kept in conv_window; commit derives the state after the first accepted ones.
  m.def(
      "causal_conv1d_verify(Tensor conv_state, Tensor(a!) conv_window, Tensor x, Tensor weight, Tensor? bias, "
      "bool silu, Tensor slot_ids, Tensor(b!) out) -> ()");
  m.def("causal_conv1d_commit(Tensor(a!) conv_state, Tensor conv_window, Tensor slot_ids, Tensor accepted) -> ()");

  // Gated DeltaNet (value heads HV a multiple of key heads H; state (V, K) per value head). Standard step:
  // reads and writes state[slot_ids[b]].
  m.def(
      "gdn_step(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor? dt_bias, "
      "bool l2norm, float scale, Tensor slot_ids, Tensor(b!) out) -> ()");
  // Replay step: output from checkpoint + ring (u, k, g); appends to the ring, or folds when it is full (or at the
  // fold_phase, as for Mamba-2).
  m.def(
      "gdn_replay_step(Tensor(a!) checkpoint, Tensor(b!) ring_u, Tensor(c!) ring_k, Tensor(d!) ring_g, Tensor(e!) cursor, "
      "Tensor(f!) arrivals, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor? dt_bias, bool l2norm, "
      "float scale, Tensor slot_ids, Tensor(g!) out, Tensor(h!)? view=None, Tensor? sr_seed=None, "
      "Tensor(i!)? fold_count=None, Tensor(j!)? fold_phase=None) -> ()");
  // Speculative verification of T tokens per row (q: (batch, T, H, K)); commit with mamba2_replay_commit.
  m.def(
      "gdn_replay_verify(Tensor(a!) checkpoint, Tensor(b!) ring_u, Tensor(c!) ring_k, Tensor(d!) ring_g, Tensor(e!) cursor, "
      "Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor? dt_bias, bool l2norm, float scale, "
      "Tensor slot_ids, Tensor? num_tokens, Tensor(f!) out, Tensor(g!)? pending=None, Tensor(h!)? arrivals=None, "
      "Tensor(i!)? view=None, Tensor? sr_seed=None, Tensor(j!)? fold_count=None) -> ()");
  m.def(
      "gdn_replay_state(Tensor checkpoint, Tensor ring_u, Tensor ring_k, Tensor ring_g, Tensor cursor, Tensor slot_ids, "
      "Tensor? positions, Tensor(a!) out) -> ()");
}
