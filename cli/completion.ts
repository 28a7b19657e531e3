// `kubectl distort completion bash|zsh`: shell completion for the `kubectl-distort` command:
// subcommands, their flags, and names from the cluster (PVCs for describe volume, nodes for
// fence/unfence) read through kubectl.
import { UsageError } from "./exit-codes.ts";

/** Subcommands and the flags each takes, the single table both shells are generated from. */
export const COMMANDS: Readonly<Record<string, readonly string[]>> = {
  status: [
    "--kubeconfig",
    "--namespace",
    "-n",
    "--all-namespaces",
    "-A",
    "--wide",
    "-o",
    "--output",
    "--help",
  ],
  describe: ["--kubeconfig", "--namespace", "-n", "-o", "--output", "--help"],
  preflight: [
    "--role",
    "--transport",
    "--core-mask",
    "--mem-size-mb",
    "--volumes",
    "--spdk-drives",
    "--host-root",
    "--strict",
    "-o",
    "--output",
    "--help",
  ],
  fence: [
    "--kubeconfig",
    "--namespace",
    "-n",
    "--all-namespaces",
    "-A",
    "--dry-run",
    "-o",
    "--output",
    "--help",
  ],
  unfence: [
    "--kubeconfig",
    "--namespace",
    "-n",
    "--all-namespaces",
    "-A",
    "--dry-run",
    "-o",
    "--output",
    "--help",
  ],
  "support-bundle": ["--kubeconfig", "--namespace", "-n", "--output-path", "--tail-lines", "--help"],
  completion: ["bash", "zsh"],
  help: [],
};

function bash(): string {
  const cases = Object.entries(COMMANDS)
    .map(([c, flags]) => `    ${c}) opts="${flags.join(" ")}" ;;`)
    .join("\n");
  return `# bash completion for kubectl-distort; load with: source <(kubectl-distort completion bash)
_kubectl_distort() {
  local cur prev cmd opts
  cur="\${COMP_WORDS[COMP_CWORD]}"
  prev="\${COMP_WORDS[COMP_CWORD-1]}"
  cmd="\${COMP_WORDS[1]}"
  if [[ \${COMP_CWORD} -eq 1 ]]; then
    COMPREPLY=( $(compgen -W "${Object.keys(COMMANDS).join(" ")}" -- "\${cur}") )
    return
  fi
  case "\${prev}" in
    -o|--output) COMPREPLY=( $(compgen -W "json yaml wide" -- "\${cur}") ); return ;;
    --role) COMPREPLY=( $(compgen -W "spdk kernel-target initiator" -- "\${cur}") ); return ;;
    --transport) COMPREPLY=( $(compgen -W "tcp rdma" -- "\${cur}") ); return ;;
    -n|--namespace) COMPREPLY=( $(compgen -W "$(kubectl get namespaces -o name 2>/dev/null | sed 's|^namespace/||')" -- "\${cur}") ); return ;;
    volume) COMPREPLY=( $(compgen -W "$(kubectl get pvc -o name 2>/dev/null | sed 's|^persistentvolumeclaim/||')" -- "\${cur}") ); return ;;
  esac
  case "\${cmd}" in
    describe) [[ \${COMP_CWORD} -eq 2 ]] && { COMPREPLY=( $(compgen -W "volume" -- "\${cur}") ); return; } ;;
    fence|unfence) [[ "\${cur}" != -* ]] && { COMPREPLY=( $(compgen -W "$(kubectl get nodes -o name 2>/dev/null | sed 's|^node/||')" -- "\${cur}") ); return; } ;;
  esac
  case "\${cmd}" in
${cases}
    *) opts="" ;;
  esac
  COMPREPLY=( $(compgen -W "\${opts}" -- "\${cur}") )
}
complete -F _kubectl_distort kubectl-distort
`;
}

function zsh(): string {
  const cmds = Object.keys(COMMANDS)
    .map((c) => `'${c}'`)
    .join(" ");
  const cases = Object.entries(COMMANDS)
    .map(([c, flags]) => `    ${c}) compadd -- ${flags.join(" ")} ;;`)
    .join("\n");
  return `#compdef kubectl-distort
# zsh completion for kubectl-distort; load with: source <(kubectl-distort completion zsh)
_kubectl_distort() {
  if (( CURRENT == 2 )); then
    compadd -- ${cmds}
    return
  fi
  case "\${words[CURRENT-1]}" in
    -o|--output) compadd -- json yaml wide; return ;;
    --role) compadd -- spdk kernel-target initiator; return ;;
    --transport) compadd -- tcp rdma; return ;;
    volume) compadd -- \${(f)"$(kubectl get pvc -o name 2>/dev/null | sed 's|^persistentvolumeclaim/||')"}; return ;;
  esac
  case "\${words[2]}" in
    describe) (( CURRENT == 3 )) && { compadd -- volume; return; } ;;
    fence|unfence) [[ "\${words[CURRENT]}" != -* ]] && { compadd -- \${(f)"$(kubectl get nodes -o name 2>/dev/null | sed 's|^node/||')"}; return; } ;;
  esac
  case "\${words[2]}" in
${cases}
  esac
}
compdef _kubectl_distort kubectl-distort
`;
}

/** The completion script for `shell`; UsageError for a shell it does not know. Pure. */
export function completionScript(shell: string | undefined): string {
  if (shell === "bash") return bash();
  if (shell === "zsh") return zsh();
  throw new UsageError(
    shell === undefined
      ? "completion needs a shell: bash or zsh"
      : `no completion for shell ${JSON.stringify(shell)} (use bash or zsh)`,
  );
}
