"""Running a candidate against a pin: the plan, the request, compare, diff, merge and exported prompts."""
