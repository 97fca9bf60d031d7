//! Sans-IO HTTP/1.x framing: request and response heads, body decoding and encoding.
