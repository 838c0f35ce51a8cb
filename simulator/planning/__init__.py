"""Capacity planning's parts (`simulator.planning.plan` puts them together): the plan file (`spec`),
analytical bounds (`bounds`), the rate search (`search`), layouts and traffic (`layouts`),
the fleet integer program (`fleet`) and its check (`choice`), tables and output (`tables`,
`report`)."""
