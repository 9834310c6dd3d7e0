"""The verdict: doctrine, bf16 grid, evidence rule, adjudication (compare), its records, routing attribution."""
