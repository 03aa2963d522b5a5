//! Commands whose output the analysis follows: `echo`, `printf`, `cat`, and the
//! decoders (`base64 -d`, `xxd -r`, `rev`, `tr` rot13, decompressors).

use super::Cmd;
use crate::analyze::decode::{b64decode, hexdecode, is_rot13, printf, rot13, unescape};
use crate::analyze::{Analyzer, Arg, Out, Stage, has_unk};
use crate::types::FileOp;

impl Analyzer<'_> {
    pub(super) fn echo(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let args = c.args;
        let mut interp = false;
        let mut newline = true;
        let mut k = 0;
        while k < args.len()
            && args[k].text.starts_with('-')
            && args[k].text.len() > 1
            && args[k].text[1..].bytes().all(|b| b"neE".contains(&b))
        {
            interp |= args[k].text.contains('e');
            newline &= !args[k].text.contains('n');
            k += 1;
        }
        let mut t = args[k..]
            .iter()
            .map(|a| a.text.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        if interp {
            t = unescape(&t, true);
        }
        if newline {
            t.push('\n');
        }
        stage.out = Some(if has_unk(&t) {
            Out::Unknown
        } else {
            Out::Known {
                text: t,
                decoded: false,
            }
        });
        false
    }

    pub(super) fn printf_cmd(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let args = c.args;
        let ops: Vec<&Arg> = args.iter().filter(|a| a.text != "--").collect();
        let ops: Vec<&Arg> = if ops.first().is_some_and(|a| a.text == "-v") {
            Vec::new()
        } else {
            ops
        };
        if let Some(fmt) = ops.first() {
            let t = printf(
                &fmt.text,
                &ops[1..].iter().map(|a| a.text.as_str()).collect::<Vec<_>>(),
            );
            stage.out = Some(match t {
                Some(t) if !has_unk(&t) => Out::Known {
                    text: t,
                    decoded: fmt.text.contains("\\x") || fmt.text.contains("\\0"),
                },
                _ => Out::Unknown,
            });
        }
        true
    }

    /// `which NAME`: where the program is (so `cp "$(which rm)" x` is a copy of rm).
    pub(super) fn which(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        if let [a] = &c.flags.operands[..] {
            stage.out = crate::analyze::exec::which(&a.text);
        }
        false
    }

    pub(super) fn cat(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let (flags, inv) = (c.flags, c.inv);
        if flags.operands.is_empty() || flags.operands.iter().all(|a| a.text == "-") {
            stage.out = Some(inv.stdin.clone());
        } else if let ([src], Some(dst)) = (&flags.operands[..], &inv.stdout_to) {
            // `cat /bin/rm > /tmp/x`: a copy.
            let (src, dst) = (src.text.clone(), dst.clone());
            self.note_copy(&src, &dst);
        }
        false
    }

    /// A decoder's output: the decoded text when the analysis can decode its input
    /// itself, else [`Out::Decoded`] (hidden text of unknown value).
    pub(super) fn decode_cmd(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        if let Some(o) = self.decoder(c) {
            stage.out = Some(o);
        }
        false
    }

    fn decoder(&mut self, c: &Cmd<'_>) -> Option<Out> {
        let (name, flags, args, inv) = (c.name, c.flags, c.args, c.inv);
        let decode = match name {
            "base64" | "base32" | "basenc" => flags.has(&["d", "D", "decode"]),
            "xxd" => flags.has(&["r", "revert"]),
            "rev" => true,
            "tr" => true,
            "gunzip" | "zcat" | "uudecode" | "unxz" | "bunzip2" => true,
            "gzip" | "bzip2" | "xz" => flags.has(&["d", "decompress"]),
            "openssl" => {
                args.iter().any(|a| a.text == "-d")
                    && args.iter().any(|a| {
                        a.text == "base64"
                            || a.text == "-base64"
                            || a.text == "enc"
                            || a.text == "-a"
                    })
            }
            _ => false,
        };
        if !decode {
            return None;
        }
        let from_file =
            flags.operands.iter().any(|a| a.text != "-") && !matches!(name, "tr" | "openssl");
        if from_file {
            for a in &flags.operands {
                let t = a.text.clone();
                self.file_op(FileOp::Read, &t, false, inv.span);
            }
            return Some(Out::Decoded);
        }
        Some(match &inv.stdin {
            Out::Remote => Out::Remote,
            Out::Network => Out::Network,
            Out::Known { text, .. } => {
                let r = match name {
                    "base64" | "openssl" | "basenc" if !flags.has(&["base32"]) => {
                        b64decode(text.trim())
                    }
                    "xxd" => hexdecode(text.trim()),
                    "rev" => Some(
                        text.trim_end_matches('\n')
                            .lines()
                            .map(|l| l.chars().rev().collect::<String>())
                            .collect::<Vec<_>>()
                            .join("\n"),
                    ),
                    "tr" => {
                        let ops: Vec<&str> =
                            flags.operands.iter().map(|a| a.text.as_str()).collect();
                        if ops.len() == 2 && is_rot13(ops[0], ops[1]) {
                            Some(rot13(text))
                        } else {
                            None
                        }
                    }
                    _ => None,
                };
                match r {
                    Some(t) => Out::Known {
                        text: t,
                        decoded: true,
                    },
                    None => Out::Decoded,
                }
            }
            _ => Out::Decoded,
        })
    }
}
