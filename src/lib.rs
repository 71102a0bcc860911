//! lockhub
