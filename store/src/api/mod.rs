//! What the store's routes and its MCP tools share: the typed inputs. A
//! read route's query type defines the parameters it accepts ([`query`]);
//! a write route's request body is the input of the MCP tool that calls it
//! ([`bodies`]), whose JSON Schema is generated from the same type. Routes
//! (`crate::http`) and tools (`crate::mcp`) both import from here and not
//! from each other.

pub mod bodies;
pub mod query;
