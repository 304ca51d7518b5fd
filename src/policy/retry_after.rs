//! `Retry-After` parsing: delta-seconds or an HTTP-date.
