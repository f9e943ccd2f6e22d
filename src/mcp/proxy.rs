//! `rozd mcp`: placeholder.
