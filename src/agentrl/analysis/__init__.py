"""The gradient-coupling lab: measurements the GCD papers use to explain why RL on agent tasks
over-generalises penalties ("Gradient Coupling: The Hidden Barrier to Generalization in Agentic
Reinforcement Learning"). `coupling` works on (prompt, response) pairs and a model; `behaviour`
on trajectory files."""
