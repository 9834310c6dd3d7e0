"""Where a failure comes from: the maths and the records of `gate diagnose` (pure; numpy only).

- `capture`: what an engine's forward produced at each capture point (the embedding, each
  decoder layer's norms, attention, MLP or experts, router and residual stream, the final
  norm and lm_head), at every position of the context, as float32 arrays;
- `metric`: the error of one capture against the reference (relative L2 error per position,
  the worst position kept), the honest band's floor and the margin a point must leave it by;
- `record`: the diagnosis record (`gate_diagnosis` 1) and its lines;
- `locate`: the localisation rule: the first point, in forward order, whose error leaves the
  honest band by more than the margin.
"""
