"""Federated LLM fine-tuning through the RAN, testbed side (issue 18): the UE population, uplink
delivery of their updates through the testbed's MAC model, the optical circuit-switch transport
controller and the packet baseline. The learning itself runs in the agent venv (`agent.federated`);
`learner` drives it over a pipe. See docs/federated.md.
"""
