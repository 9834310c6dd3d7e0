"""The pure core: no engine, no printing, no torch, no platform or git reads.

Its sub-packages are floors, each importing only from those above it in this list:

- `storage`: atomic writes and file hashes;
- `traces`: trace v1 (records, reader, writer), its MoE routing fields, the machine key,
  shards;
- `engine`: the engine contract (`Engine`, `PromptInput`, `ForcedDecode`);
- `verdict`: the doctrine, the grid and the evidence rule, adjudication (`compare`), its
  records (`GateResult`), routing attribution, the run record;
- `pins`: suites, oracle settings, pin folders and pin diffs;
- `goldens`: golden files and the judging of moves;
- `calibration`: drift statistics, the recommended doctrine, the self-test's judging;
- `diagnosis`: `gate diagnose`'s capture records, error metric, honest band, localisation
  rule and record (numpy, no torch; imports nothing else of gate).
"""
