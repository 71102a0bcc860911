//! `lockhub osdp install` (placeholder replaced below).
