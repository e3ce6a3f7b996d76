//! The harness's command-line enums (its workloads and its subjects) are each declared from one table: a variant, its
//! name on the command line and in the output, and a line describing it: its doc, and its text in the header and
//! `--help`.

/// Declares such an enum, with `ALL` in table order, `name`, `describe`, `Display` and clap's `ValueEnum`.
macro_rules! named_enum {
    ($(#[$meta:meta])* pub enum $enum:ident { $($variant:ident = $name:literal: $describe:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $enum {
            $(#[doc = $describe] $variant,)*
        }

        impl $enum {
            /// Every one, in the order the tables list them.
            pub const ALL: &[$enum] = &[$($enum::$variant,)*];

            /// The name the command line and the output use.
            pub fn name(self) -> &'static str {
                match self {
                    $($enum::$variant => $name,)*
                }
            }

            /// What it is, for the header and `--help` (the tables' notes say more).
            pub fn describe(self) -> &'static str {
                match self {
                    $($enum::$variant => $describe,)*
                }
            }
        }

        impl std::fmt::Display for $enum {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl clap::ValueEnum for $enum {
            fn value_variants<'a>() -> &'a [Self] {
                Self::ALL
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(clap::builder::PossibleValue::new(self.name()).help(self.describe()))
            }
        }
    };
}

pub(crate) use named_enum;
