"""``gpuledger report``: the seed's questions answered from the warehouse, as terminal
tables (rich) or a self-contained HTML file with charts."""
