"""The gradient-coupling lab: measurements the GCD papers use to explain why RL on agent tasks
over-generalises penalties (REFERENCE section 5). `coupling` works on (prompt, response) pairs
and a model; `behaviour` on trajectory files."""
